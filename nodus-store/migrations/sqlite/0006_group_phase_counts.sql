-- A group's runs counted by phase, kept by triggers on every write of `resources`, so that a
-- group's admission (`Store::group_phases`) reads a handful of rows whatever the group's size
-- (counting the index, as 0005 did, costs one entry per member: quadratic over a group's
-- creation). `phase_key` is '-' for a run with no phase and '+' followed by the phase
-- otherwise (a primary key cannot hold NULL). A row whose count reaches zero is removed.
CREATE TABLE group_phase_counts (
    project    TEXT NOT NULL,
    group_name TEXT NOT NULL,
    phase_key  TEXT NOT NULL,
    members    INTEGER NOT NULL,
    PRIMARY KEY (project, group_name, phase_key)
) WITHOUT ROWID;

INSERT INTO group_phase_counts (project, group_name, phase_key, members)
SELECT project, group_name, CASE WHEN phase IS NULL THEN '-' ELSE '+' || phase END, COUNT(*)
FROM resources
WHERE kind = 'agentruns' AND group_name IS NOT NULL
GROUP BY project, group_name, phase;

CREATE TRIGGER group_phase_counts_insert AFTER INSERT ON resources
WHEN NEW.kind = 'agentruns' AND NEW.group_name IS NOT NULL
BEGIN
    INSERT INTO group_phase_counts (project, group_name, phase_key, members)
    VALUES (NEW.project, NEW.group_name,
            CASE WHEN NEW.phase IS NULL THEN '-' ELSE '+' || NEW.phase END, 1)
    ON CONFLICT (project, group_name, phase_key) DO UPDATE SET members = members + 1;
END;

CREATE TRIGGER group_phase_counts_delete AFTER DELETE ON resources
WHEN OLD.kind = 'agentruns' AND OLD.group_name IS NOT NULL
BEGIN
    UPDATE group_phase_counts SET members = members - 1
    WHERE project = OLD.project AND group_name = OLD.group_name
      AND phase_key = CASE WHEN OLD.phase IS NULL THEN '-' ELSE '+' || OLD.phase END;
    DELETE FROM group_phase_counts
    WHERE project = OLD.project AND group_name = OLD.group_name AND members <= 0;
END;

CREATE TRIGGER group_phase_counts_update AFTER UPDATE OF group_name, phase ON resources
WHEN NEW.kind = 'agentruns'
  AND (OLD.group_name IS NOT NEW.group_name OR OLD.phase IS NOT NEW.phase)
BEGIN
    UPDATE group_phase_counts SET members = members - 1
    WHERE OLD.group_name IS NOT NULL
      AND project = OLD.project AND group_name = OLD.group_name
      AND phase_key = CASE WHEN OLD.phase IS NULL THEN '-' ELSE '+' || OLD.phase END;
    DELETE FROM group_phase_counts
    WHERE OLD.group_name IS NOT NULL
      AND project = OLD.project AND group_name = OLD.group_name AND members <= 0;
    INSERT INTO group_phase_counts (project, group_name, phase_key, members)
    SELECT NEW.project, NEW.group_name,
           CASE WHEN NEW.phase IS NULL THEN '-' ELSE '+' || NEW.phase END, 1
    WHERE NEW.group_name IS NOT NULL
    ON CONFLICT (project, group_name, phase_key) DO UPDATE SET members = members + 1;
END;

-- The index that 0004/0005 added for the count is no longer read.
DROP INDEX resources_group_phase;
