-- A project's credit account is kept under the kind `accounts` (nodus-core's ledger), no
-- longer under `projects`: the accounts written before move to it. Their documents still say
-- `"kind": "Project"` until the ledger next writes them; nothing reads that field.
UPDATE resources SET kind = 'accounts'
    WHERE project = '_system' AND kind = 'projects';
