CREATE TABLE single (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO single SELECT g, 0 FROM generate_series(1, 100) g;
CREATE TABLE pool (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO pool SELECT g, 0 FROM generate_series(1, 2000) g;
CREATE TABLE bank (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO bank SELECT g, 1000 FROM generate_series(1, 100) g;
