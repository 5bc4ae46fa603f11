-- Provider ingress (PostgreSQL; keep in step with sqlite/0004_ingress.sql).

-- The hash of the secret the provider sends with its events for this instance.
ALTER TABLE instances ADD COLUMN ingress_secret_hash TEXT;

-- Every authenticated provider event, stored before the ingress route answers.
CREATE TABLE provider_events (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id   TEXT NOT NULL,
    event         TEXT NOT NULL,
    payload       TEXT NOT NULL,
    received_at   BIGINT NOT NULL,
    processed_at  BIGINT,
    error         TEXT
);
CREATE INDEX provider_events_pending ON provider_events (processed_at, id);

-- Messages received by an instance (the dashboard's inbound log).
CREATE TABLE inbound_messages (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id         TEXT NOT NULL,
    instance_id         TEXT NOT NULL,
    sender              TEXT NOT NULL,               -- E.164, or the raw id when unresolved
    group_id            TEXT,
    message_type        TEXT NOT NULL,
    text                TEXT,
    external_message_id TEXT NOT NULL,
    message_at          BIGINT NOT NULL,             -- the message's own timestamp
    received_at         BIGINT NOT NULL,
    UNIQUE (instance_id, external_message_id)
);
CREATE INDEX inbound_messages_customer ON inbound_messages (customer_id, id);

-- Privacy ids (`...@lid`) resolved to phone numbers, learned from the alternate ids.
CREATE TABLE lid_map (
    instance_id TEXT NOT NULL,
    lid         TEXT NOT NULL,
    phone       TEXT NOT NULL,
    learned_at  BIGINT NOT NULL,
    PRIMARY KEY (instance_id, lid)
);

-- The furthest delivery status of each sent message (statuses never go back).
CREATE TABLE message_status (
    instance_id         TEXT NOT NULL,
    external_message_id TEXT NOT NULL,
    status              TEXT NOT NULL,
    status_rank         BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL,
    PRIMARY KEY (instance_id, external_message_id)
);

-- Connection changes, told to customers only once they have held for the debounce
-- period (a flapping connection does not spam them).
CREATE TABLE connection_changes (
    instance_id   TEXT PRIMARY KEY,
    state         TEXT NOT NULL,                      -- open | connecting | close
    reported      TEXT NOT NULL,                      -- as told: open, close, refused, logged_out, ban_suspected, ...
    changed_at    BIGINT NOT NULL,
    emitted_state TEXT                                -- the last state customers were told
);

-- Delivery watchdog: when a sent message was checked for a delivery acknowledgement.
ALTER TABLE message_log ADD COLUMN ack_checked_at BIGINT;
CREATE INDEX message_log_ack ON message_log (status, ack_checked_at, created_at);

-- The latest pairing QR the provider sent (a data URL), for the dashboard; NULL when
-- the provider stopped issuing codes.
ALTER TABLE instances ADD COLUMN qr_code TEXT;
ALTER TABLE instances ADD COLUMN qr_updated_at BIGINT;

-- Calls seen, to tell a missed call from an answered one.
CREATE TABLE calls (
    instance_id TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    answered    BIGINT NOT NULL DEFAULT 0,
    missed      BIGINT NOT NULL DEFAULT 0,
    seen_at     BIGINT NOT NULL,
    PRIMARY KEY (instance_id, call_id)
);

-- When the 24-hour conversation window after a contact's last message was reported
-- closed.
ALTER TABLE contact_activity ADD COLUMN window_closed_at BIGINT;
