-- A group's runs counted by phase, kept by a trigger on every write of `resources`, so that a
-- group's admission (`Store::group_phases`) reads a handful of rows whatever the group's size
-- (counting the index, as 0004 did, costs one entry per member: quadratic over a group's
-- creation). `phase_key` is '-' for a run with no phase and '+' followed by the phase
-- otherwise (a primary key cannot hold NULL). A row whose count reaches zero is removed.
-- A run that changes phase takes its two counters' row locks in key order, so that two such
-- writes cannot deadlock each other.
CREATE TABLE group_phase_counts (
    project    text   NOT NULL,
    group_name text   NOT NULL,
    phase_key  text   NOT NULL,
    members    bigint NOT NULL,
    PRIMARY KEY (project, group_name, phase_key)
);

INSERT INTO group_phase_counts (project, group_name, phase_key, members)
SELECT project, group_name, CASE WHEN phase IS NULL THEN '-' ELSE '+' || phase END, COUNT(*)
FROM resources
WHERE kind = 'agentruns' AND group_name IS NOT NULL
GROUP BY project, group_name, phase;

CREATE FUNCTION group_phase_counts_follow() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    old_project text;
    old_group text;
    old_key text;
    new_project text;
    new_group text;
    new_key text;
    change record;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.kind = 'agentruns' AND OLD.group_name IS NOT NULL THEN
        old_project := OLD.project;
        old_group := OLD.group_name;
        old_key := CASE WHEN OLD.phase IS NULL THEN '-' ELSE '+' || OLD.phase END;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.kind = 'agentruns' AND NEW.group_name IS NOT NULL THEN
        new_project := NEW.project;
        new_group := NEW.group_name;
        new_key := CASE WHEN NEW.phase IS NULL THEN '-' ELSE '+' || NEW.phase END;
    END IF;
    IF old_group IS NOT DISTINCT FROM new_group AND old_key IS NOT DISTINCT FROM new_key THEN
        RETURN NULL;
    END IF;
    FOR change IN
        SELECT * FROM (VALUES
            (old_project, old_group, old_key, -1),
            (new_project, new_group, new_key, 1)
        ) AS c(project, group_name, phase_key, delta)
        WHERE c.phase_key IS NOT NULL
        ORDER BY c.project, c.group_name, c.phase_key
    LOOP
        INSERT INTO group_phase_counts AS counts (project, group_name, phase_key, members)
        VALUES (change.project, change.group_name, change.phase_key, change.delta)
        ON CONFLICT (project, group_name, phase_key)
        DO UPDATE SET members = counts.members + EXCLUDED.members;
    END LOOP;
    IF old_key IS NOT NULL THEN
        DELETE FROM group_phase_counts
        WHERE project = old_project AND group_name = old_group AND phase_key = old_key
          AND members <= 0;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER group_phase_counts_follow
AFTER INSERT OR DELETE OR UPDATE OF group_name, phase ON resources
FOR EACH ROW EXECUTE FUNCTION group_phase_counts_follow();

-- The index that 0004/0005 added for the count is no longer read.
DROP INDEX resources_group_phase;
