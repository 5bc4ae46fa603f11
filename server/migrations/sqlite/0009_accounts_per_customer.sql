-- An email may have an account in several customers (so inviting it tells the
-- inviter nothing about other customers), but only one of them may have a password:
-- that is the account the email signs in to. Keep in step with
-- postgres/0010_accounts_per_customer.sql.
--
-- SQLite cannot drop the column's UNIQUE constraint: the table is rebuilt, by the
-- documented procedure (Store::migrate runs SQLite's migrations with foreign keys off
-- and checks them after).
CREATE TABLE dashboard_users_new (
    id              TEXT PRIMARY KEY,                 -- usr_...
    customer_id     TEXT REFERENCES customers (id),   -- NULL for operators
    email           TEXT NOT NULL,                    -- lower case
    role            TEXT NOT NULL,                    -- owner | admin | developer | viewer | operator
    password_hash   TEXT,                             -- argon2id PHC string; NULL until the invitation is accepted
    totp_secret     TEXT,                             -- base32; NULL until enrolled
    totp_last_step  BIGINT,                           -- last accepted 30 s step: each code works once
    created_by      TEXT,                             -- user id, or 'cli'
    created_at      BIGINT NOT NULL,
    last_sign_in_at BIGINT,
    disabled_at     BIGINT
);
INSERT INTO dashboard_users_new (id, customer_id, email, role, password_hash, totp_secret, totp_last_step,
                                 created_by, created_at, last_sign_in_at, disabled_at)
    SELECT id, customer_id, email, role, password_hash, totp_secret, totp_last_step,
           created_by, created_at, last_sign_in_at, disabled_at FROM dashboard_users;
DROP TABLE dashboard_users;
ALTER TABLE dashboard_users_new RENAME TO dashboard_users;
CREATE INDEX dashboard_users_customer ON dashboard_users (customer_id, created_at);
-- One account per email within a customer (operators: among operators).
CREATE UNIQUE INDEX dashboard_users_email_in_customer ON dashboard_users (COALESCE(customer_id, ''), email);
-- One account per email that can sign in.
CREATE UNIQUE INDEX dashboard_users_email_signs_in ON dashboard_users (email) WHERE password_hash IS NOT NULL;
CREATE INDEX dashboard_users_email ON dashboard_users (email);
