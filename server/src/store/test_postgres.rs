//! Unit tests' PostgreSQL: a fresh database with the gateway's schema for one test, when
//! the suite runs on PostgreSQL (`GATEWAY_TEST_DATABASE_URL`); on SQLite there is none.

use super::Store;

/// A fresh database `gw_<prefix>_<random>` with the gateway's schema, the admin URL and
/// the database's name; dropped by `drop_database`. None when the suite runs on SQLite.
pub async fn postgres_store(prefix: &str) -> Option<(Store, String, String)> {
    use sqlx::Connection;
    let admin = std::env::var("GATEWAY_TEST_DATABASE_URL").ok().filter(|u| u.starts_with("postgres"))?;
    let db = format!("gw_{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {db}")).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    let (base, query) = admin.split_once('?').map_or((admin.as_str(), None), |(b, q)| (b, Some(q)));
    let url = format!("{}/{db}{}", &base[..base.rfind('/').unwrap()], query.map_or(String::new(), |q| format!("?{q}")));
    Some((Store::open(&url, 4, None).await.unwrap(), admin, db))
}

pub async fn drop_database(store: Store, admin: &str, db: &str) {
    use sqlx::Connection;
    store.close().await;
    let mut conn = sqlx::AnyConnection::connect(admin).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)")).execute(&mut conn).await.unwrap();
}
