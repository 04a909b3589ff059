//! The shared backend: PostgreSQL, so several gateway instances create and resolve one set of
//! codes. Migrations are versioned in `short_url_migrations` and applied under an advisory lock,
//! so instances starting together do not race.

use postgres::{Client, NoTls};

use super::{Conn, Connector, Counts, NewRow, Record, Val};
use postgres::types::{IsNull, ToSql, Type};

/// Schema versions, applied in order.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS short_url_codes (
        code TEXT PRIMARY KEY,
        origin_url TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT
    );
    CREATE INDEX IF NOT EXISTS short_url_codes_expires_at ON short_url_codes (expires_at)
        WHERE expires_at IS NOT NULL;",
    // Issue 28: options, owners, deletion tombstones, visit counters, tags and visits.
    "ALTER TABLE short_url_codes ADD COLUMN valid_since BIGINT,
        ADD COLUMN max_visits BIGINT,
        ADD COLUMN cap_used BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN visits BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN bot_visits BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN title TEXT,
        ADD COLUMN tags TEXT,
        ADD COLUMN domain TEXT,
        ADD COLUMN owner TEXT,
        ADD COLUMN deleted_at BIGINT,
        ADD COLUMN findable INT;
    CREATE INDEX short_url_codes_owner_created ON short_url_codes (owner, created_at) WHERE owner IS NOT NULL;
    CREATE INDEX short_url_codes_owner_visits ON short_url_codes (owner, visits) WHERE owner IS NOT NULL;
    CREATE INDEX short_url_codes_created ON short_url_codes (created_at);
    CREATE INDEX short_url_codes_visits ON short_url_codes (visits);
    CREATE INDEX short_url_codes_origin ON short_url_codes (origin_url) WHERE findable = 1;
    CREATE TABLE short_url_tags (tag TEXT NOT NULL, code TEXT NOT NULL, PRIMARY KEY (tag, code));
    CREATE INDEX short_url_tags_code ON short_url_tags (code);
    CREATE TABLE short_url_visits (
        id BIGSERIAL PRIMARY KEY,
        code TEXT NOT NULL,
        at BIGINT NOT NULL,
        referer TEXT,
        ua_class TEXT NOT NULL,
        country TEXT,
        ip_hash TEXT NOT NULL
    );
    CREATE INDEX short_url_visits_code_at ON short_url_visits (code, at);",
    // Visits aggregated per (code, day, class, referer host): counts and series stay exact while
    // only a bounded sample of visit rows is kept (see `links::flush_visits`).
    "CREATE TABLE short_url_visit_stats (
        code TEXT NOT NULL,
        day BIGINT NOT NULL,
        ua_class TEXT NOT NULL,
        referer TEXT NOT NULL,
        n BIGINT NOT NULL,
        PRIMARY KEY (code, day, ua_class, referer)
    );
    INSERT INTO short_url_visit_stats (code, day, ua_class, referer, n)
        SELECT code, at / 86400, ua_class, coalesce(referer, ''), count(*) FROM short_url_visits GROUP BY 1, 2, 3, 4;",
    // Lists order by (created_at, code) or (visits, code). SQLite's indexes on a WITHOUT ROWID
    // table carry the code after the column; PostgreSQL's did not, so every page sorted all the
    // ties of its first key (a 100-link batch shares one created_at; most links share a visit
    // count): order_by=-visits at 1M links took p50 60 ms, p99 1.16 s.
    "CREATE INDEX short_url_codes_created_code ON short_url_codes (created_at, code);
    CREATE INDEX short_url_codes_visits_code ON short_url_codes (visits, code);
    CREATE INDEX short_url_codes_owner_created_code ON short_url_codes (owner, created_at, code) WHERE owner IS NOT NULL;
    CREATE INDEX short_url_codes_owner_visits_code ON short_url_codes (owner, visits, code) WHERE owner IS NOT NULL;
    DROP INDEX short_url_codes_created;
    DROP INDEX short_url_codes_visits;
    DROP INDEX short_url_codes_owner_created;
    DROP INDEX short_url_codes_owner_visits;",
];

/// Arbitrary key of the migration advisory lock.
const MIGRATION_LOCK: i64 = 0x5745_4952_5355; // "WEIRSU"

/// Opens connections to one database.
pub struct Postgres {
    url: String,
}

impl Postgres {
    /// A connector for `url`.
    pub fn new(url: String) -> Self {
        Postgres { url }
    }
}

/// Whether `url` is a connection string the driver accepts (checked at load, without connecting).
pub fn check_url(url: &str) -> Result<(), String> {
    url.parse::<postgres::Config>().map(drop).map_err(|err| format!("storage.url: {err}"))
}

/// A driver error as the log and the answers give it. The driver's own text for an error the
/// server sent is only "db error"; the server's words say what is wrong (a missing database, a
/// refused password, a failed statement).
fn e(err: postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => err.to_string(),
    }
}

/// `url` without its password, for logs.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "postgres://(unparsable url)".into(),
    }
}

impl Connector for Postgres {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    fn describe(&self) -> String {
        redact(&self.url)
    }
    fn connect(&self) -> Result<Box<dyn Conn>, String> {
        let mut config: postgres::Config = self.url.parse().map_err(e)?;
        config.connect_timeout(std::time::Duration::from_secs(3));
        let mut client = config.connect(NoTls).map_err(e)?;
        migrate(&mut client)?;
        Ok(Box::new(PgConn(client, None, None, Default::default())))
    }
}

fn migrate(c: &mut Client) -> Result<(), String> {
    let mut tx = c.transaction().map_err(e)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(e)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS short_url_migrations (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        .map_err(e)?;
    let done: i32 = tx.query_one("SELECT coalesce(max(version), 0) FROM short_url_migrations", &[]).map_err(e)?.get(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
        tx.batch_execute(sql).map_err(|err| format!("migration {}: {err}", i + 1))?;
        tx.execute("INSERT INTO short_url_migrations (version) VALUES ($1)", &[&((i + 1) as i32)]).map_err(e)?;
    }
    search_index(&mut tx)?;
    tx.commit().map_err(e)
}

/// Whether the `pg_trgm` search index was found missing and could not be made (logged once).
static NO_SEARCH_INDEX: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The trigram index that serves `ILIKE '%term%'` searches (terms of 3 characters or more):
/// `pg_trgm` is a trusted extension, so the database owner may create it. Where that fails,
/// searches scan, and this is logged once per process.
fn search_index(tx: &mut postgres::Transaction<'_>) -> Result<(), String> {
    let have =
        tx.query_opt("SELECT 1 FROM pg_indexes WHERE indexname = 'short_url_codes_search'", &[]).map_err(e)?.is_some();
    if have || NO_SEARCH_INDEX.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut sp = tx.transaction().map_err(e)?;
    let made = sp.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_trgm;
         CREATE INDEX IF NOT EXISTS short_url_codes_search ON short_url_codes
             USING gin (origin_url gin_trgm_ops, title gin_trgm_ops, tags gin_trgm_ops);",
    );
    match made {
        Ok(()) => sp.commit().map_err(e),
        Err(err) => {
            drop(sp);
            if !NO_SEARCH_INDEX.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!("short-url: no pg_trgm search index ({err}); link searches scan the table");
            }
            Ok(())
        }
    }
}

struct PgConn(
    Client,
    Option<postgres::Statement>,
    Option<postgres::Statement>,
    std::collections::HashMap<String, postgres::Statement>,
);

impl PgConn {
    /// A prepared statement of the shared dialect, prepared once per connection.
    fn prepared(&mut self, sql: &str) -> Result<postgres::Statement, String> {
        if let Some(s) = self.3.get(sql) {
            return Ok(s.clone());
        }
        let s = self.0.prepare(sql).map_err(e)?;
        if self.3.len() > 256 {
            self.3.clear();
        }
        self.3.insert(sql.to_owned(), s.clone());
        Ok(s)
    }
}

impl ToSql for Val {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Null => Ok(IsNull::Yes),
            Val::Int(i) => match *ty {
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => i.to_string().to_sql(ty, out),
                _ => i.to_sql(ty, out),
            },
            Val::Text(s) => s.as_str().to_sql(ty, out),
        }
    }
    fn accepts(_: &Type) -> bool {
        true
    }
    postgres::types::to_sql_checked!();
}

fn val_of(row: &postgres::Row, i: usize) -> Result<Val, String> {
    let ty = row.columns().get(i).map(|c| c.type_().clone()).unwrap_or(Type::TEXT);
    Ok(match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(i).map_err(e)?.map_or(Val::Null, Val::Int),
        Type::INT4 => row.try_get::<_, Option<i32>>(i).map_err(e)?.map_or(Val::Null, |v| Val::Int(v.into())),
        Type::INT2 => row.try_get::<_, Option<i16>>(i).map_err(e)?.map_or(Val::Null, |v| Val::Int(v.into())),
        Type::BOOL => row.try_get::<_, Option<bool>>(i).map_err(e)?.map_or(Val::Null, |v| Val::Int(v.into())),
        _ => row.try_get::<_, Option<String>>(i).map_err(e)?.map_or(Val::Null, Val::Text),
    })
}

impl Conn for PgConn {
    fn exec(&mut self, sql: &str) -> Result<(), String> {
        self.0.batch_execute(sql).map_err(e)
    }
    fn try_insert(
        &mut self,
        code: &str,
        origin_url: &str,
        created_at: i64,
        expires_at: Option<i64>,
    ) -> Result<bool, String> {
        let stmt = match &self.1 {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .0
                    .prepare(
                        "INSERT INTO short_url_codes (code, origin_url, created_at, expires_at) VALUES ($1, $2, $3, $4) ON CONFLICT (code) DO NOTHING",
                    )
                    .map_err(e)?;
                self.1 = Some(s.clone());
                s
            }
        };
        Ok(self.0.execute(&stmt, &[&code, &origin_url, &created_at, &expires_at]).map_err(e)? == 1)
    }
    /// One round trip for the whole batch: the columns as arrays, unnested server-side.
    fn insert_many(&mut self, rows: &[NewRow<'_>]) -> Result<Vec<bool>, String> {
        let stmt = match &self.2 {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .0
                    .prepare(
                        "INSERT INTO short_url_codes (code, origin_url, created_at, expires_at)
                         SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
                         ON CONFLICT (code) DO NOTHING RETURNING code",
                    )
                    .map_err(e)?;
                self.2 = Some(s.clone());
                s
            }
        };
        let codes: Vec<&str> = rows.iter().map(|r| r.code).collect();
        let urls: Vec<&str> = rows.iter().map(|r| r.origin_url).collect();
        let created: Vec<i64> = rows.iter().map(|r| r.created_at).collect();
        let expires: Vec<Option<i64>> = rows.iter().map(|r| r.expires_at).collect();
        let returned = self.0.query(&stmt, &[&codes, &urls, &created, &expires]).map_err(e)?;
        let mut inserted: std::collections::HashSet<String> = returned.iter().map(|r| r.get(0)).collect();
        // A code returned once marks its first row only (a repeat within the batch was skipped).
        Ok(rows.iter().map(|r| inserted.remove(r.code)).collect())
    }
    fn get(&mut self, code: &str) -> Result<Option<Record>, String> {
        let row = self
            .0
            .query_opt("SELECT origin_url, created_at, expires_at FROM short_url_codes WHERE code = $1", &[&code])
            .map_err(e)?;
        Ok(row.map(|r| Record {
            code: code.to_owned(),
            origin_url: r.get(0),
            created_at: r.get(1),
            expires_at: r.get(2),
        }))
    }
    fn counts(&mut self, now: i64) -> Result<Counts, String> {
        let r = self
            .0
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= $1) FROM short_url_codes",
                &[&now],
            )
            .map_err(e)?;
        let (codes, expired): (i64, i64) = (r.get(0), r.get(1));
        Ok(Counts { codes: codes as u64, expired: expired as u64 })
    }
    fn purge(&mut self, before: i64) -> Result<u64, String> {
        // Deleted links stay as tombstones: their codes are never handed out again.
        self.0
            .execute(
                "DELETE FROM short_url_codes WHERE expires_at IS NOT NULL AND expires_at < $1 AND deleted_at IS NULL",
                &[&before],
            )
            .map_err(e)
    }
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        let stmt = self.prepared(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let rows = self.0.query(&stmt, &refs).map_err(e)?;
        rows.iter().map(|r| (0..r.len()).map(|i| val_of(r, i)).collect()).collect()
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        let stmt = self.prepared(sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        self.0.execute(&stmt, &refs).map_err(e)
    }
}
