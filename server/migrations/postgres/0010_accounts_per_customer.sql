-- An email may have an account in several customers (so inviting it tells the
-- inviter nothing about other customers), but only one of them may have a password:
-- that is the account the email signs in to. Keep in step with
-- sqlite/0009_accounts_per_customer.sql.
ALTER TABLE dashboard_users DROP CONSTRAINT dashboard_users_email_key;
-- One account per email within a customer (operators: among operators).
CREATE UNIQUE INDEX dashboard_users_email_in_customer ON dashboard_users (COALESCE(customer_id, ''), email);
-- One account per email that can sign in.
CREATE UNIQUE INDEX dashboard_users_email_signs_in ON dashboard_users (email) WHERE password_hash IS NOT NULL;
CREATE INDEX dashboard_users_email ON dashboard_users (email);
