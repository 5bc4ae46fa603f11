-- An event of an instance without a webhook endpoint needs no delivery. It is done as
-- `skipped_no_endpoint` in the statement that writes it, against the endpoints that
-- statement sees, where a dispatcher used to claim it and then skip it: two writes
-- more for every such event (issue 22; docs/architecture.md, "Webhook delivery").
-- Every path that writes an event (the batch functions, the ingress) writes this table,
-- so the rule is the table's. An event whose instance has an endpoint (enabled or not)
-- is left to the dispatcher, which also decides what it was not subscribed to.
CREATE FUNCTION gateway_outbox_no_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.instance_id = NEW.instance_id) THEN
        NEW.delivered_at := NEW.created_at;
        NEW.outcome := 'skipped_no_endpoint';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER outbox_no_endpoint BEFORE INSERT ON outbox
    FOR EACH ROW WHEN (NEW.delivered_at IS NULL) EXECUTE FUNCTION gateway_outbox_no_endpoint();
