-- When each delivery step happened (the dashboard's message log shows the time of
-- each), and indexes for the jobs and charts that read by time. Keep in step with
-- postgres/0011_delivery_steps.sql.
ALTER TABLE message_status ADD COLUMN delivered_at BIGINT;
ALTER TABLE message_status ADD COLUMN read_at BIGINT;
ALTER TABLE message_status ADD COLUMN failed_at BIGINT;
-- Before this, only the latest step's time was kept: the best that is known.
UPDATE message_status SET delivered_at = updated_at WHERE status_rank IN (2, 3, 4);
UPDATE message_status SET read_at = updated_at WHERE status_rank IN (3, 4);
UPDATE message_status SET failed_at = updated_at WHERE status = 'ERROR';
-- Retention and the charts read these by time.
CREATE INDEX message_log_created ON message_log (created_at);
CREATE INDEX inbound_messages_received ON inbound_messages (received_at);
CREATE INDEX message_status_updated ON message_status (updated_at);
CREATE INDEX provider_events_received ON provider_events (received_at);
CREATE INDEX contacts_last_sent ON contacts (last_sent_at);
