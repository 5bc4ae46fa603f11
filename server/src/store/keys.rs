//! API keys: stored as a SHA-256 hash plus a short visible prefix, never in clear.

use super::{Cols, FromCols, Store, StoreError, new_id, now_ms};
use rusqlite::types::Value as SqlValue;

/// An API key as stored (without the key itself).
#[derive(Clone, Debug)]
pub struct ApiKeyRecord {
    pub id: String,
    pub customer_id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

impl FromCols for ApiKeyRecord {
    fn from_cols(r: &impl Cols) -> Result<ApiKeyRecord, StoreError> {
        Ok(ApiKeyRecord {
            id: r.col("id")?,
            customer_id: r.col("customer_id")?,
            name: r.col("name")?,
            prefix: r.col("prefix")?,
            created_at: r.col("created_at")?,
            revoked_at: r.col("revoked_at")?,
            last_used_at: r.col("last_used_at")?,
        })
    }
}

pub(super) const KEY_COLUMNS: &str = "id, customer_id, name, prefix, created_at, revoked_at, last_used_at";

impl Store {
    /// Stores a new key by its hash and visible prefix.
    pub async fn insert_api_key(
        &self,
        customer_id: &str,
        name: &str,
        prefix: &str,
        key_hash: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        self.customer(customer_id).await?;
        let id = new_id("key");
        sqlx::query(
            "INSERT INTO api_keys (id, customer_id, name, prefix, key_hash, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(customer_id)
        .bind(name)
        .bind(prefix)
        .bind(key_hash)
        .bind(now_ms())
        .execute(&self.write)
        .await?;
        self.forget_cached();
        let row = sqlx::query(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"))
            .bind(&id)
            .fetch_one(&self.write)
            .await?;
        ApiKeyRecord::from_cols(&row)
    }

    /// The key with this hash, revoked or not.
    /// `api_key_by_hash` for a request: from the cache when it holds the hash (known
    /// or unknown; see `cache` for how long a change may take to be seen).
    pub async fn api_key_for_request(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        if let Some(found) = self.cache.key(key_hash) {
            return Ok(found);
        }
        let generation = self.cache.generation();
        let found = self.api_key_by_hash(key_hash).await?;
        self.cache.put_key(key_hash, found.clone(), generation);
        Ok(found)
    }

    pub async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        const SQL: &str = "SELECT id, customer_id, name, prefix, created_at, revoked_at, last_used_at \
                           FROM api_keys WHERE key_hash = $1";
        self.read_one(SQL, vec![SqlValue::Text(key_hash.to_string())]).await
    }

    /// Revokes a key (at once: every request looks the key up).
    pub async fn revoke_api_key(&self, id: &str) -> Result<ApiKeyRecord, StoreError> {
        sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(&self.write)
            .await?;
        self.forget_cached();
        let row = sqlx::query(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.write)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("API key {id}")))?;
        ApiKeyRecord::from_cols(&row)
    }

    /// Records that a key was used.
    pub async fn touch_api_key(&self, id: &str, at: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE api_keys SET last_used_at = $2 WHERE id = $1")
            .bind(id)
            .bind(at)
            .execute(&self.write)
            .await?;
        Ok(())
    }
}
