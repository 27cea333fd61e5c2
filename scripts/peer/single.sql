-- One single-row update (autocommit), as txgate's single-document PATCH.
\set id random(1, 100)
UPDATE single SET n = n + 1 WHERE id = :id;
