-- The fields controllers select on, as columns beside the document (written with it, like
-- `uid`), and indexed: a group's members (every admission and reconcile) and runs by phase
-- (every claim). Each holds the field's value when it is a string, NULL otherwise.
ALTER TABLE resources ADD COLUMN group_name text, ADD COLUMN phase text;
UPDATE resources SET
    group_name = CASE WHEN json_typeof(document #> '{spec,group}') = 'string'
                      THEN document #>> '{spec,group}' END,
    phase = CASE WHEN json_typeof(document #> '{status,phase}') = 'string'
                 THEN document #>> '{status,phase}' END;
CREATE INDEX resources_group ON resources (project, kind, group_name);
CREATE INDEX resources_phase ON resources (kind, phase);
