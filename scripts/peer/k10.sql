-- A k = 10 update transaction over a pool of rows, as txgate's.
\set a random(1, 1990)
BEGIN;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 0;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 1;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 2;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 3;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 4;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 5;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 6;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 7;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 8;
UPDATE pool SET balance = balance + 1 WHERE id = :a + 9;
COMMIT;
