-- Pages of a listing (`ord > ? ORDER BY ord LIMIT ?` within a project and kind) read this
-- index in order and stop at the page's end; an index holds the rowid (`ord`) after its columns.
CREATE INDEX resources_list ON resources (project, kind);
