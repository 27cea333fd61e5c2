-- The contended bank: 16 clients move money between 100 accounts. Rows are
-- locked in id order so that PostgreSQL needs no deadlock retries (txgate
-- orders its locks itself).
\set a random(1, 100)
\set d random(1, 99)
\set b (:a + :d - 1) % 100 + 1
\set lo least(:a, :b)
\set hi greatest(:a, :b)
BEGIN;
UPDATE bank SET balance = balance - 1 WHERE id = :lo;
UPDATE bank SET balance = balance + 1 WHERE id = :hi;
COMMIT;
