-- A group's admission counts its members by phase (`Store::group_phases`) from this index
-- alone, reading no row: its cost is the group's index entries, never its documents.
CREATE INDEX resources_group_phase ON resources (project, kind, group_name, phase);
