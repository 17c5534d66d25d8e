-- The fields controllers select on, as columns beside the document (written with it, like
-- `uid`), and indexed: a group's members (every admission and reconcile) and runs by phase
-- (every claim). Each holds the field's value when it is text, NULL otherwise.
ALTER TABLE resources ADD COLUMN group_name TEXT;   -- spec.group
ALTER TABLE resources ADD COLUMN phase TEXT;        -- status.phase
UPDATE resources SET
    group_name = CASE WHEN json_type(document, '$.spec.group') = 'text'
                      THEN json_extract(document, '$.spec.group') END,
    phase = CASE WHEN json_type(document, '$.status.phase') = 'text'
                 THEN json_extract(document, '$.status.phase') END;
CREATE INDEX resources_group ON resources (project, kind, group_name);
CREATE INDEX resources_phase ON resources (kind, phase);
