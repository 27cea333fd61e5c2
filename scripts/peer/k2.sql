-- A k = 2 update transaction over a pool of rows, as txgate's.
\set a random(1, 1990)
BEGIN;
UPDATE pool SET balance = balance + 1 WHERE id = :a;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 1;
COMMIT;
