-- A group's admission counts its members by phase (`Store::group_phases`) from this index
-- alone (an index-only scan), reading no document.
CREATE INDEX resources_group_phase ON resources (project, kind, group_name, phase);
