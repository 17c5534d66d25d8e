-- Pages of a listing (`ord > $ ORDER BY ord LIMIT $` within a project and kind) read this
-- index in order and stop at the page's end.
CREATE INDEX resources_list ON resources (project, kind, ord);
