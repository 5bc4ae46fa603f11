//! Unit tests' stores with the gateway's schema: a migrated SQLite file to read with
//! rusqlite, and, when the suite runs on PostgreSQL (`GATEWAY_TEST_DATABASE_URL`), a
//! fresh database for one test (on SQLite there is none).

use super::Store;

/// A SQLite store in a temporary directory, migrated by the gateway and closed again, and
/// a rusqlite connection to it (for its schema and its plans). The directory lives as
/// long as the first half.
pub async fn migrated_sqlite(name: &str) -> (tempfile::TempDir, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    Store::open(&format!("sqlite://{}?mode=rwc", path.display()), 2, None).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    (dir, conn)
}

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

/// The plans PostgreSQL makes for a statement prepared by `prepare` (`PREPARE name(types)
/// AS ...`) and run by `execute` (`EXECUTE name(values)`), with sequential scans priced out (an
/// empty table's plan would read it whole): the plan made for the values
/// (`force_custom_plan`) and the generic one a prepared statement may keep after five
/// runs (`force_generic_plan`), each with its mode. The database is then dropped.
pub async fn prepared_plans(
    store: Store,
    admin: &str,
    db: &str,
    prepare: &str,
    execute: &str,
) -> Vec<(&'static str, String)> {
    let plans = async {
        let mut conn = store.write.acquire().await?;
        sqlx::query("SET enable_seqscan = off").execute(&mut *conn).await?;
        sqlx::query(prepare).execute(&mut *conn).await?;
        let mut plans = Vec::new();
        for mode in ["force_custom_plan", "force_generic_plan"] {
            sqlx::query(&format!("SET plan_cache_mode = {mode}")).execute(&mut *conn).await?;
            let rows = sqlx::query(&format!("EXPLAIN {execute}")).fetch_all(&mut *conn).await?;
            let lines = rows.iter().map(|r| sqlx::Row::try_get(r, 0)).collect::<Result<Vec<String>, _>>()?;
            plans.push((mode, lines.join("\n")));
        }
        Ok::<_, sqlx::Error>(plans)
    }
    .await;
    drop_database(store, admin, db).await;
    plans.unwrap()
}
