-- Dashboard accounts, sessions and sign-in state (SQLite; keep in step with
-- postgres/0007_dashboard.sql). Times are Unix milliseconds; secrets are stored as
-- hashes except the TOTP seed, which the gateway needs to check codes.

-- A person who signs in: a customer's user (owner, admin, developer, viewer) or a
-- service operator (customer_id NULL, role operator). One account per email.
CREATE TABLE dashboard_users (
    id              TEXT PRIMARY KEY,                 -- usr_...
    customer_id     TEXT REFERENCES customers (id),   -- NULL for operators
    email           TEXT NOT NULL UNIQUE,             -- lower case
    role            TEXT NOT NULL,                    -- owner | admin | developer | viewer | operator
    password_hash   TEXT,                             -- argon2id PHC string; NULL until the invitation is accepted
    totp_secret     TEXT,                             -- base32; NULL until enrolled
    totp_last_step  BIGINT,                           -- last accepted 30 s step: each code works once
    created_by      TEXT,                             -- user id, or 'cli'
    created_at      BIGINT NOT NULL,
    last_sign_in_at BIGINT,
    disabled_at     BIGINT
);
CREATE INDEX dashboard_users_customer ON dashboard_users (customer_id, created_at);

-- One-time sign-in links (invitations). Only the SHA-256 of the 256-bit token is kept.
CREATE TABLE dashboard_invitations (
    token_hash TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES dashboard_users (id),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at    BIGINT
);
CREATE INDEX dashboard_invitations_user ON dashboard_invitations (user_id);

-- Ten single-use recovery codes per account, each an argon2id hash.
CREATE TABLE dashboard_recovery_codes (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id   TEXT NOT NULL REFERENCES dashboard_users (id),
    code_hash TEXT NOT NULL,
    used_at   BIGINT
);
CREATE INDEX dashboard_recovery_codes_user ON dashboard_recovery_codes (user_id);

-- Sessions, by the SHA-256 of the cookie value. `stage` is mfa (password checked,
-- code next), enroll (first sign-in: authenticator next) or full.
CREATE TABLE dashboard_sessions (
    id_hash      TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES dashboard_users (id),
    stage        TEXT NOT NULL,
    csrf_token   TEXT NOT NULL,
    pending_totp TEXT,                                -- enrolment seed until a code confirms it
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL                      -- absolute expiry
);
CREATE INDEX dashboard_sessions_user ON dashboard_sessions (user_id);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

-- Sign-in throttling: failures per bucket (an email, from an unknown browser or from
-- one known browser) in the current hour, and when the next attempt is allowed.
CREATE TABLE dashboard_login_throttle (
    bucket          TEXT PRIMARY KEY,
    failures        BIGINT NOT NULL,
    window_start    BIGINT NOT NULL,
    next_allowed_at BIGINT NOT NULL
);

-- Browsers that completed a sign-in (device cookies): their attempts are throttled
-- apart from everyone else's, so nobody can lock the owner out by failing on purpose.
CREATE TABLE dashboard_devices (
    token_hash   TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES dashboard_users (id),
    created_at   BIGINT NOT NULL,
    last_used_at BIGINT NOT NULL
);
CREATE INDEX dashboard_devices_user ON dashboard_devices (user_id);

-- Server-side keys shared by replicas (the sign-in form's CSRF key).
CREATE TABLE dashboard_settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The dashboard's lists: suppressions newest first, message log per instance.
CREATE INDEX suppressed_recipients_created ON suppressed_recipients (customer_id, created_at);
CREATE INDEX message_log_instance ON message_log (customer_id, instance_id, id);
