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
    // The search texts get a table of their own, kept by triggers, and the trigram index moves
    // there (`search_index`). A visit's counter update changes `visits`, which two indexes hold,
    // so PostgreSQL never makes it a HOT update: it writes an entry into every index of the row,
    // and into a GIN index over the URL, title and tags that is one entry per trigram. Measured
    // at 300,000 links: a third of what a visit to an uncached code cost. The texts change only
    // at creation, a PATCH and the expiry sweep, which is when the triggers run (the row trigger
    // only for a PATCH that sets the texts; a counter update fires none).
    "DROP INDEX IF EXISTS short_url_codes_search;
    CREATE TABLE short_url_search (code TEXT PRIMARY KEY, origin_url TEXT NOT NULL, title TEXT, tags TEXT);
    INSERT INTO short_url_search (code, origin_url, title, tags) SELECT code, origin_url, title, tags FROM short_url_codes;
    CREATE FUNCTION short_url_search_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO short_url_search (code, origin_url, title, tags) SELECT code, origin_url, title, tags FROM added;
        RETURN NULL;
    END $$;
    CREATE TRIGGER short_url_search_add AFTER INSERT ON short_url_codes REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION short_url_search_add();
    CREATE FUNCTION short_url_search_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE short_url_search SET origin_url = NEW.origin_url, title = NEW.title, tags = NEW.tags WHERE code = NEW.code;
        RETURN NULL;
    END $$;
    CREATE TRIGGER short_url_search_change AFTER UPDATE OF origin_url, title, tags ON short_url_codes FOR EACH ROW
        WHEN (OLD.origin_url IS DISTINCT FROM NEW.origin_url OR OLD.title IS DISTINCT FROM NEW.title
              OR OLD.tags IS DISTINCT FROM NEW.tags)
        EXECUTE FUNCTION short_url_search_change();
    CREATE FUNCTION short_url_search_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM short_url_search WHERE code IN (SELECT code FROM removed);
        RETURN NULL;
    END $$;
    CREATE TRIGGER short_url_search_remove AFTER DELETE ON short_url_codes REFERENCING OLD TABLE AS removed
        FOR EACH STATEMENT EXECUTE FUNCTION short_url_search_remove();",
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
        let searchable = migrate(&mut client)?;
        Ok(Box::new(PgConn { client, insert_one: None, insert_many: None, statements: Default::default(), searchable }))
    }
}

/// Brings the schema up to date; whether the trigram search index is there.
fn migrate(c: &mut Client) -> Result<bool, String> {
    let mut tx = c.transaction().map_err(e)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(e)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS short_url_migrations (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        .map_err(e)?;
    let done: i32 = tx.query_one("SELECT coalesce(max(version), 0) FROM short_url_migrations", &[]).map_err(e)?.get(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
        tx.batch_execute(sql).map_err(|err| format!("migration {}: {err}", i + 1))?;
        tx.execute("INSERT INTO short_url_migrations (version) VALUES ($1)", &[&((i + 1) as i32)]).map_err(e)?;
    }
    let searchable = search_index(&mut tx)?;
    tx.commit().map_err(e)?;
    Ok(searchable)
}

/// Whether the `pg_trgm` search index was found missing and could not be made (logged once).
static NO_SEARCH_INDEX: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The trigram index on `short_url_search` that serves `ILIKE '%term%'` searches (terms of 3
/// characters or more), made when missing; whether it is there. `pg_trgm` is a trusted
/// extension, so the database owner may create it. Where that fails, searches scan the links,
/// and this is logged once per process.
fn search_index(tx: &mut postgres::Transaction<'_>) -> Result<bool, String> {
    // An instance of an older version (a rolling upgrade) re-creates the trigram index on the
    // links' rows that migration 5 dropped; every visit would pay for it again until dropped.
    let stale =
        tx.query_opt("SELECT 1 FROM pg_indexes WHERE indexname = 'short_url_codes_search'", &[]).map_err(e)?.is_some();
    if stale {
        tx.batch_execute("DROP INDEX IF EXISTS short_url_codes_search").map_err(e)?;
        log::info!(
            "short-url: dropped short_url_codes_search, which an older version made (searches use short_url_search)"
        );
    }
    let have =
        tx.query_opt("SELECT 1 FROM pg_indexes WHERE indexname = 'short_url_search_trgm'", &[]).map_err(e)?.is_some();
    if have || NO_SEARCH_INDEX.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(have);
    }
    let mut sp = tx.transaction().map_err(e)?;
    let made = sp.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_trgm;
         CREATE INDEX IF NOT EXISTS short_url_search_trgm ON short_url_search
             USING gin (origin_url gin_trgm_ops, title gin_trgm_ops, tags gin_trgm_ops);",
    );
    match made {
        Ok(()) => sp.commit().map_err(e).map(|()| true),
        Err(err) => {
            drop(sp);
            if !NO_SEARCH_INDEX.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!("short-url: no pg_trgm search index ({err}); link searches scan the table");
            }
            Ok(false)
        }
    }
}

struct PgConn {
    client: Client,
    /// `try_insert`'s statement, prepared on first use.
    insert_one: Option<postgres::Statement>,
    /// `insert_many`'s statement, prepared on first use.
    insert_many: Option<postgres::Statement>,
    /// The shared dialect's statements, by text.
    statements: std::collections::HashMap<String, postgres::Statement>,
    /// Whether `short_url_search` has its trigram index (`search_index`).
    searchable: bool,
}

impl PgConn {
    /// A prepared statement of the shared dialect, prepared once per connection.
    fn prepared(&mut self, sql: &str) -> Result<postgres::Statement, String> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).map_err(e)?;
        if self.statements.len() > 256 {
            self.statements.clear();
        }
        self.statements.insert(sql.to_owned(), s.clone());
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
    fn search_texts(&self) -> bool {
        self.searchable
    }
    fn exec(&mut self, sql: &str) -> Result<(), String> {
        self.client.batch_execute(sql).map_err(e)
    }
    fn try_insert(
        &mut self,
        code: &str,
        origin_url: &str,
        created_at: i64,
        expires_at: Option<i64>,
    ) -> Result<bool, String> {
        let stmt = match &self.insert_one {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .client
                    .prepare(
                        "INSERT INTO short_url_codes (code, origin_url, created_at, expires_at) VALUES ($1, $2, $3, $4) ON CONFLICT (code) DO NOTHING",
                    )
                    .map_err(e)?;
                self.insert_one = Some(s.clone());
                s
            }
        };
        Ok(self.client.execute(&stmt, &[&code, &origin_url, &created_at, &expires_at]).map_err(e)? == 1)
    }
    /// One round trip for the whole batch: the columns as arrays, unnested server-side.
    fn insert_many(&mut self, rows: &[NewRow<'_>]) -> Result<Vec<bool>, String> {
        let stmt = match &self.insert_many {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .client
                    .prepare(
                        "INSERT INTO short_url_codes (code, origin_url, created_at, expires_at)
                         SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
                         ON CONFLICT (code) DO NOTHING RETURNING code",
                    )
                    .map_err(e)?;
                self.insert_many = Some(s.clone());
                s
            }
        };
        let codes: Vec<&str> = rows.iter().map(|r| r.code).collect();
        let urls: Vec<&str> = rows.iter().map(|r| r.origin_url).collect();
        let created: Vec<i64> = rows.iter().map(|r| r.created_at).collect();
        let expires: Vec<Option<i64>> = rows.iter().map(|r| r.expires_at).collect();
        let returned = self.client.query(&stmt, &[&codes, &urls, &created, &expires]).map_err(e)?;
        let mut inserted: std::collections::HashSet<String> = returned.iter().map(|r| r.get(0)).collect();
        // A code returned once marks its first row only (a repeat within the batch was skipped).
        Ok(rows.iter().map(|r| inserted.remove(r.code)).collect())
    }
    fn get(&mut self, code: &str) -> Result<Option<Record>, String> {
        let row = self
            .client
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
            .client
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= $1) FROM short_url_codes",
                &[&now],
            )
            .map_err(e)?;
        let (codes, expired): (i64, i64) = (r.get(0), r.get(1));
        Ok(Counts { codes: codes as u64, expired: expired as u64 })
    }
    fn purge(&mut self, before: i64) -> Result<u64, String> {
        // Deleted links stay as tombstones: their codes are never handed out again. A purged
        // code can be (a `custom_code` asked for again), so its tags, visit counts and visit
        // rows go with it, in the same statement (its search text goes by trigger).
        let row = self
            .client
            .query_one(
                "WITH gone AS (
                     DELETE FROM short_url_codes WHERE expires_at IS NOT NULL AND expires_at < $1 AND deleted_at IS NULL
                     RETURNING code),
                 tags AS (DELETE FROM short_url_tags WHERE code IN (SELECT code FROM gone)),
                 stats AS (DELETE FROM short_url_visit_stats WHERE code IN (SELECT code FROM gone)),
                 visits AS (DELETE FROM short_url_visits WHERE code IN (SELECT code FROM gone))
                 SELECT count(*) FROM gone",
                &[&before],
            )
            .map_err(e)?;
        Ok(row.get::<_, i64>(0) as u64)
    }
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        let stmt = self.prepared(sql)?;
        values(&self.client.query(&stmt, &refs(params)).map_err(e)?)
    }
    fn query_planned(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        values(&self.client.query(sql, &refs(params)).map_err(e)?)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        let stmt = self.prepared(sql)?;
        self.client.execute(&stmt, &refs(params)).map_err(e)
    }
}

/// `params` as the driver takes them.
fn refs(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// Every column of every row, as [`Val`]s.
fn values(rows: &[postgres::Row]) -> Result<Vec<Vec<Val>>, String> {
    rows.iter().map(|r| (0..r.len()).map(|i| val_of(r, i)).collect()).collect()
}
