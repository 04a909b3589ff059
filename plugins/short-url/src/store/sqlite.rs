//! The embedded backend: SQLite (bundled) in WAL mode with `synchronous=FULL`, so a committed
//! transaction survives a crash or power loss. Migrations are versioned with `user_version`.

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use super::{Conn, Connector, Counts, NewRow, Record, Val};

/// Rows per multi-row INSERT (4 parameters each, far below SQLite's 32,766).
const ROWS_PER_INSERT: usize = 100;

/// `INSERT ... VALUES (?,?,?,?) x n ...`, skipping taken codes.
fn insert_sql(n: usize) -> String {
    let mut sql = String::with_capacity(120 + n * 10);
    sql.push_str("INSERT INTO codes (code, origin_url, created_at, expires_at) VALUES ");
    for i in 0..n {
        sql.push_str(if i == 0 { "(?,?,?,?)" } else { ",(?,?,?,?)" });
    }
    sql.push_str(" ON CONFLICT(code) DO NOTHING");
    sql
}

/// Schema versions, applied in order.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE codes (
        code TEXT PRIMARY KEY,
        origin_url TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX codes_expires_at ON codes (expires_at) WHERE expires_at IS NOT NULL;",
    // Issue 28: options, owners, deletion tombstones, visit counters, tags and visits.
    "ALTER TABLE codes ADD COLUMN valid_since INTEGER;
    ALTER TABLE codes ADD COLUMN max_visits INTEGER;
    ALTER TABLE codes ADD COLUMN cap_used INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE codes ADD COLUMN visits INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE codes ADD COLUMN bot_visits INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE codes ADD COLUMN title TEXT;
    ALTER TABLE codes ADD COLUMN tags TEXT;
    ALTER TABLE codes ADD COLUMN domain TEXT;
    ALTER TABLE codes ADD COLUMN owner TEXT;
    ALTER TABLE codes ADD COLUMN deleted_at INTEGER;
    ALTER TABLE codes ADD COLUMN findable INTEGER;
    CREATE INDEX codes_owner_created ON codes (owner, created_at) WHERE owner IS NOT NULL;
    CREATE INDEX codes_owner_visits ON codes (owner, visits) WHERE owner IS NOT NULL;
    CREATE INDEX codes_created ON codes (created_at);
    CREATE INDEX codes_visits ON codes (visits);
    CREATE INDEX codes_origin ON codes (origin_url) WHERE findable = 1;
    CREATE TABLE tags (tag TEXT NOT NULL, code TEXT NOT NULL, PRIMARY KEY (tag, code)) WITHOUT ROWID;
    CREATE INDEX tags_code ON tags (code);
    CREATE TABLE visits (
        id INTEGER PRIMARY KEY,
        code TEXT NOT NULL,
        at INTEGER NOT NULL,
        referer TEXT,
        ua_class TEXT NOT NULL,
        country TEXT,
        ip_hash TEXT NOT NULL
    );
    CREATE INDEX visits_code_at ON visits (code, at);",
    // Visits aggregated per (code, day, class, referer host): counts and series stay exact while
    // only a bounded sample of visit rows is kept (see `links::flush_visits`).
    "CREATE TABLE visit_stats (
        code TEXT NOT NULL,
        day INTEGER NOT NULL,
        ua_class TEXT NOT NULL,
        referer TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (code, day, ua_class, referer)
    ) WITHOUT ROWID;
    INSERT INTO visit_stats (code, day, ua_class, referer, n)
        SELECT code, at / 86400, ua_class, coalesce(referer, ''), count(*) FROM visits GROUP BY 1, 2, 3, 4;",
    // Search in origin_url, title and tags without a scan: an FTS5 trigram index kept by triggers.
    // Links are never deleted (tombstones), so only inserts and updates of these columns sync it;
    // an update finds the old entry through the index itself (its old URL as a phrase).
    "CREATE VIRTUAL TABLE codes_search USING fts5(code UNINDEXED, origin_url, title, tags, tokenize = 'trigram');
    INSERT INTO codes_search (code, origin_url, title, tags) SELECT code, origin_url, title, tags FROM codes;
    CREATE TRIGGER codes_search_insert AFTER INSERT ON codes BEGIN
        INSERT INTO codes_search (code, origin_url, title, tags) VALUES (new.code, new.origin_url, new.title, new.tags);
    END;
    CREATE TRIGGER codes_search_update AFTER UPDATE OF origin_url, title, tags ON codes BEGIN
        DELETE FROM codes_search WHERE rowid IN (
            SELECT rowid FROM codes_search
            WHERE codes_search MATCH 'origin_url : \"' || replace(old.origin_url, '\"', '\"\"') || '\"' AND code = old.code);
        INSERT INTO codes_search (code, origin_url, title, tags) VALUES (new.code, new.origin_url, new.title, new.tags);
    END;",
    // FTS5 merges its segments less eagerly: a merge once 16 segments of a level wait (not 4),
    // forced at 64 (not 16). Merging was about a fifth of the insert trigger's cost; creation at
    // 1M links went from 55.7k to 71.4k URLs/s, searches stayed within 10% (more segments to read).
    "INSERT INTO codes_search (codes_search, rank) VALUES ('automerge', 16);
    INSERT INTO codes_search (codes_search, rank) VALUES ('crisismerge', 64);",
    // The search index at half the cost per link (creation at 1M links: see
    // docs/plugins/short-url.md): contentless (the texts live in `codes` only), without positions
    // (`detail=none`: a term is looked up as the AND of its trigrams, not as a phrase) or column
    // sizes. Its rowids come from `search_ids` (appended to, in order: FTS5 writes rowids in
    // order cheaply), one per indexed version of a link's texts. A contentless entry is deleted
    // by giving its texts again: `links::update` does so before a change (the trigger below
    // indexed the new texts; since migration 7 it lists them for `Conn::index_pending`). Entries of purged links stay behind as candidates the `ILIKE`
    // test of every search rejects (at most one per link ever created).
    "DROP TRIGGER codes_search_insert;
    DROP TRIGGER codes_search_update;
    DROP TABLE codes_search;
    CREATE TABLE search_ids (id INTEGER PRIMARY KEY, code TEXT NOT NULL);
    CREATE VIRTUAL TABLE codes_search USING fts5(
        origin_url, title, tags, tokenize = 'trigram', detail = none, columnsize = 0, content = '');
    INSERT INTO codes_search (codes_search, rank) VALUES ('automerge', 16);
    INSERT INTO codes_search (codes_search, rank) VALUES ('crisismerge', 64);
    INSERT INTO search_ids (code) SELECT code FROM codes;
    INSERT INTO codes_search (rowid, origin_url, title, tags)
        SELECT s.id, c.origin_url, c.title, c.tags FROM search_ids s CROSS JOIN codes c ON c.code = s.code;
    CREATE TRIGGER codes_search_insert AFTER INSERT ON codes BEGIN
        INSERT INTO search_ids (code) VALUES (new.code);
        INSERT INTO codes_search (rowid, origin_url, title, tags)
            VALUES (last_insert_rowid(), new.origin_url, new.title, new.tags);
    END;
    CREATE TRIGGER codes_search_update AFTER UPDATE OF origin_url, title, tags ON codes
    WHEN old.origin_url IS NOT new.origin_url OR old.title IS NOT new.title OR old.tags IS NOT new.tags BEGIN
        INSERT INTO search_ids (code) VALUES (new.code);
        INSERT INTO codes_search (rowid, origin_url, title, tags)
            VALUES (last_insert_rowid(), new.origin_url, new.title, new.tags);
    END;",
    // The search index written once per transaction, not once per row (`Conn::index_pending`).
    // FTS5 writes its pending entries to disk as a new segment at every savepoint, and the
    // writer opens one per batch (SQLite one more per statement that fires a trigger), so with
    // the triggers above each 100-link batch became a segment of its own, merged again and again:
    // about a third of creation's CPU time. The triggers now only number the texts to index and
    // list them in `search_pending`.
    "CREATE TABLE search_pending (id INTEGER PRIMARY KEY);
    DROP TRIGGER codes_search_insert;
    DROP TRIGGER codes_search_update;
    CREATE TRIGGER codes_search_insert AFTER INSERT ON codes BEGIN
        INSERT INTO search_ids (code) VALUES (new.code);
        INSERT INTO search_pending (id) VALUES (last_insert_rowid());
    END;
    CREATE TRIGGER codes_search_update AFTER UPDATE OF origin_url, title, tags ON codes
    WHEN old.origin_url IS NOT new.origin_url OR old.title IS NOT new.title OR old.tags IS NOT new.tags BEGIN
        INSERT INTO search_ids (code) VALUES (new.code);
        INSERT INTO search_pending (id) VALUES (last_insert_rowid());
    END;",
];

/// Indexes the texts listed in `search_pending`, in one statement: FTS5 keeps them in memory
/// and writes one segment at commit.
const INDEX_PENDING: [&str; 2] = [
    "INSERT INTO codes_search (rowid, origin_url, title, tags)
        SELECT s.id, c.origin_url, c.title, c.tags
        FROM search_pending p CROSS JOIN search_ids s ON s.id = p.id CROSS JOIN codes c ON c.code = s.code",
    "DELETE FROM search_pending",
];

/// Opens connections to one database file.
pub struct Sqlite {
    path: PathBuf,
}

impl Sqlite {
    /// A connector for `path` (created with its directory on first connect).
    pub fn new(path: PathBuf) -> Self {
        Sqlite { path }
    }
}

fn e(err: rusqlite::Error) -> String {
    err.to_string()
}

impl Connector for Sqlite {
    fn backend(&self) -> &'static str {
        "sqlite"
    }
    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
    fn connect(&self) -> Result<Box<dyn Conn>, String> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
        }
        let conn = Connection::open(&self.path).map_err(e)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(e)?;
        // WAL + FULL: a commit is durable when it returns. Codes are random keys, so every insert
        // lands on a different B-tree page: a large page cache and memory-mapped reads keep those
        // pages from being re-read through the kernel on each commit (measured: most of the
        // writer's time went to pread copies with the 2 MiB default). The store's maintenance
        // thread runs passive checkpoints (`Conn::maintain`) beside the writer, so that the
        // writer's own auto-checkpoint (every 16k pages, which bounds the WAL) finds little left
        // to copy and stalls its commit less.
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=-65536; PRAGMA mmap_size=1073741824; PRAGMA wal_autocheckpoint=16384;",
        )
        .map_err(e)?;
        migrate(&conn)?;
        Ok(Box::new(SqliteConn(conn, Default::default(), Default::default())))
    }
}

fn migrate(conn: &Connection) -> Result<(), String> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(e)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let tx_sql = format!("BEGIN IMMEDIATE; {sql}; PRAGMA user_version = {}; COMMIT;", i + 1);
        if let Err(err) = conn.execute_batch(&tx_sql) {
            let _ = conn.execute_batch("ROLLBACK");
            // Another connection may have migrated concurrently.
            let now: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(e)?;
            if now < (i + 1) as i64 {
                return Err(format!("migration {}: {err}", i + 1));
            }
        }
    }
    Ok(())
}

/// A connection, with the trigram probe counts its searches took (`links::list`).
struct SqliteConn(Connection, super::links::ProbeCache, Dialects);

/// The shared dialect's statements as SQLite's ([`dialect`]), translated once per text: the
/// translation (two replaces and a scan) was 1.5% of a redirect's CPU time on an uncached code.
#[derive(Default)]
struct Dialects(std::cell::RefCell<std::collections::HashMap<String, std::sync::Arc<str>>>);

/// Texts kept at most; a store's statements are a few dozen (chunked `VALUES` lists vary in
/// length), so this is only a bound.
const MAX_DIALECTS: usize = 512;

impl Dialects {
    fn of(&self, sql: &str) -> std::sync::Arc<str> {
        if let Some(done) = self.0.borrow().get(sql) {
            return done.clone();
        }
        let done: std::sync::Arc<str> = dialect(sql).into();
        let mut map = self.0.borrow_mut();
        if map.len() >= MAX_DIALECTS {
            map.clear();
        }
        map.insert(sql.to_owned(), done.clone());
        done
    }
}

impl Conn for SqliteConn {
    fn probe_cache(&mut self) -> Option<&mut super::links::ProbeCache> {
        Some(&mut self.1)
    }
    fn search_index(&self, param: &str) -> Option<String> {
        Some(format!(
            "code IN (SELECT code FROM short_url_search_ids WHERE id IN
                (SELECT rowid FROM short_url_codes_search WHERE short_url_codes_search MATCH {param}))"
        ))
    }
    fn index_pending(&mut self) -> Result<(), String> {
        for sql in INDEX_PENDING {
            self.exec(sql)?;
        }
        Ok(())
    }
    fn exec(&mut self, sql: &str) -> Result<(), String> {
        // Prepared once: the writer runs the same few statements (BEGIN, SAVEPOINT...) per batch.
        self.0.prepare_cached(sql).and_then(|mut stmt| stmt.raw_execute()).map(|_| ()).map_err(e)
    }
    fn insert_many(&mut self, rows: &[NewRow<'_>]) -> Result<Vec<bool>, String> {
        // One statement per 100 rows instead of one per row: a request's entries are bound and
        // stepped through the VM once. When fewer rows went in than were sent (a taken code:
        // about one in 10^7 at 10M codes), the statement is undone and the chunk goes row by
        // row to learn which.
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            self.exec("SAVEPOINT rows")?;
            let mut stmt = self.0.prepare_cached(&insert_sql(chunk.len())).map_err(e)?;
            for (i, r) in chunk.iter().enumerate() {
                let at = i * 4;
                stmt.raw_bind_parameter(at + 1, r.code).map_err(e)?;
                stmt.raw_bind_parameter(at + 2, r.origin_url).map_err(e)?;
                stmt.raw_bind_parameter(at + 3, r.created_at).map_err(e)?;
                stmt.raw_bind_parameter(at + 4, r.expires_at).map_err(e)?;
            }
            let inserted = stmt.raw_execute().map_err(e)?;
            drop(stmt);
            if inserted == chunk.len() {
                self.exec("RELEASE rows")?;
                out.extend(std::iter::repeat_n(true, chunk.len()));
            } else {
                self.exec("ROLLBACK TO rows")?;
                self.exec("RELEASE rows")?;
                for r in chunk {
                    out.push(self.try_insert(r.code, r.origin_url, r.created_at, r.expires_at)?);
                }
            }
        }
        Ok(out)
    }
    fn try_insert(
        &mut self,
        code: &str,
        origin_url: &str,
        created_at: i64,
        expires_at: Option<i64>,
    ) -> Result<bool, String> {
        let mut stmt = self
            .0
            .prepare_cached(
                "INSERT INTO codes (code, origin_url, created_at, expires_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT(code) DO NOTHING",
            )
            .map_err(e)?;
        Ok(stmt.execute(params![code, origin_url, created_at, expires_at]).map_err(e)? == 1)
    }
    fn get(&mut self, code: &str) -> Result<Option<Record>, String> {
        let mut stmt =
            self.0.prepare_cached("SELECT origin_url, created_at, expires_at FROM codes WHERE code = ?1").map_err(e)?;
        stmt.query_row(params![code], |r| {
            Ok(Record { code: code.to_owned(), origin_url: r.get(0)?, created_at: r.get(1)?, expires_at: r.get(2)? })
        })
        .optional()
        .map_err(e)
    }
    fn counts(&mut self, now: i64) -> Result<Counts, String> {
        let codes: i64 = self.0.query_row("SELECT count(*) FROM codes", [], |r| r.get(0)).map_err(e)?;
        let expired: i64 = self
            .0
            .query_row(
                "SELECT count(*) FROM codes WHERE expires_at IS NOT NULL AND expires_at <= ?1",
                params![now],
                |r| r.get(0),
            )
            .map_err(e)?;
        Ok(Counts { codes: codes as u64, expired: expired as u64 })
    }
    fn maintain(&mut self) -> Result<(), String> {
        self.0.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).map_err(e)
    }
    fn purge(&mut self, before: i64) -> Result<u64, String> {
        // Deleted links stay as tombstones: their codes are never handed out again. A purged
        // code can be (a `custom_code` asked for again), so its tags, visit counts and visit
        // rows go with it, in the same transaction: the next link of that code starts clean.
        let tx = self.0.transaction().map_err(e)?;
        let expired = "expires_at IS NOT NULL AND expires_at < ?1 AND deleted_at IS NULL";
        for table in ["tags", "visit_stats", "visits"] {
            let sql = format!("DELETE FROM {table} WHERE code IN (SELECT code FROM codes WHERE {expired})");
            tx.execute(&sql, params![before]).map_err(e)?;
        }
        let n = tx.execute(&format!("DELETE FROM codes WHERE {expired}"), params![before]).map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(n as u64)
    }
    fn query_within(&mut self, sql: &str, params: &[Val], budget: u32) -> Result<Option<Vec<Vec<Val>>>, String> {
        // Called every 1,000 virtual machine steps; `true` interrupts the statement.
        let gave_up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = gave_up.clone();
        let mut left = budget;
        self.0
            .progress_handler(
                1000,
                Some(move || {
                    if left == 0 {
                        flag.store(true, std::sync::atomic::Ordering::Relaxed);
                        return true;
                    }
                    left -= 1;
                    false
                }),
            )
            .map_err(e)?;
        let out = self.query(sql, params);
        self.0.progress_handler(0, None::<fn() -> bool>).map_err(e)?;
        match out {
            Ok(rows) => Ok(Some(rows)),
            Err(_) if gave_up.load(std::sync::atomic::Ordering::Relaxed) => Ok(None),
            Err(err) => Err(err),
        }
    }
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        let mut stmt = self.prepare(sql)?;
        let n = stmt.column_count();
        bind(&mut stmt, params)?;
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(e)? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i).map_err(e)? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(v) => Val::Int(v),
                    ValueRef::Real(v) => Val::Int(v as i64),
                    ValueRef::Text(t) | ValueRef::Blob(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                });
            }
            out.push(row);
        }
        Ok(out)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        let mut stmt = self.prepare(sql)?;
        bind(&mut stmt, params)?;
        Ok(stmt.raw_execute().map_err(e)? as u64)
    }
}

/// Binds `params[i - 1]` to parameter `i`: [`SqliteConn::prepare`] wrote each `$N` as `?N`,
/// whose index is N. (Looking each `$N` up by name cost O(parameters) per parameter: 13 % of
/// the visit writer's time with 600-parameter inserts.)
fn bind(stmt: &mut rusqlite::CachedStatement<'_>, params: &[Val]) -> Result<(), String> {
    for i in 1..=stmt.parameter_count() {
        let v = params.get(i - 1).ok_or_else(|| format!("no value for ${i}"))?;
        stmt.raw_bind_parameter(i, v).map_err(e)?;
    }
    Ok(())
}

/// The shared dialect in SQLite's: tables without the `short_url_` prefix, `LIKE` for `ILIKE`
/// (case-insensitive for ASCII in SQLite), `?N` for `$N` (the same parameter, bound by index).
fn dialect(sql: &str) -> String {
    let sql = sql.replace("short_url_", "").replace("ILIKE", "LIKE");
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

impl SqliteConn {
    /// `sql` prepared (once per text) in SQLite's dialect ([`dialect`]).
    fn prepare(&self, sql: &str) -> Result<rusqlite::CachedStatement<'_>, String> {
        self.0.prepare_cached(&self.2.of(sql)).map_err(e)
    }
}

impl rusqlite::ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value};
        Ok(match self {
            Val::Null => ToSqlOutput::Owned(Value::Null),
            Val::Int(i) => ToSqlOutput::Owned(Value::Integer(*i)),
            Val::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::links::{self, ListQuery, Scope};

    fn found(conn: &mut dyn Conn, term: &str, probe: i64) -> Vec<String> {
        let q = ListQuery { search: Some(term.into()), page_size: 100, ..ListQuery::default() };
        let (links, _, _) = links::list_within(conn, &q, &Scope::All, probe, u32::MAX, u32::MAX)
            .unwrap_or_else(|e| panic!("{term}: {e}"));
        let mut codes: Vec<String> = links.into_iter().map(|l| l.code).collect();
        codes.sort();
        codes
    }

    #[test]
    fn a_store_indexed_before_migration_6_is_reindexed_and_a_changed_link_is_found_by_its_new_text() {
        let dir = std::env::temp_dir().join(format!("weir-short-url-m6-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("t.db");
        {
            // A store as migration 5 left it, links indexed by the old trigger.
            let old = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
            for (i, sql) in MIGRATIONS.iter().take(5).enumerate() {
                old.execute_batch(&format!("{sql}; PRAGMA user_version = {};", i + 1))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            old.execute_batch(
                "INSERT INTO codes (code, origin_url, created_at, title) VALUES
                    ('aaaa', 'https://one.example/x', 1, 'First'),
                    ('bbbb', 'https://two.example/y', 2, NULL),
                    ('a-very-long-custom-code', 'https://three.example/z', 3, 'Third');",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut conn = Sqlite::new(path).connect().unwrap_or_else(|e| panic!("{e}"));
        for probe in [links::PROBE, 0] {
            assert_eq!(found(&mut *conn, "one.example", probe), ["aaaa"], "probe {probe}");
            assert_eq!(found(&mut *conn, "first", probe), ["aaaa"], "probe {probe}");
            assert_eq!(found(&mut *conn, ".example/", probe), ["a-very-long-custom-code", "aaaa", "bbbb"]);
        }
        // A new link is indexed by the new trigger; a changed one by its new texts, its old
        // entry deleted from the index.
        let e = crate::store::NewEntry { origin_url: "https://four.example/w".into(), ..Default::default() };
        assert_eq!(links::insert_committed(&mut *conn, "cccc", &e, 4), Ok(true));
        let mut link = links::get(&mut *conn, "bbbb").ok().flatten().unwrap_or_else(|| panic!("bbbb"));
        link.origin_url = "https://five.example/v".into();
        link.title = Some("Renamed".into());
        assert_eq!(links::update(&mut *conn, &link, false).map(|c| c.is_some()), Ok(true));
        for probe in [links::PROBE, 0] {
            assert_eq!(found(&mut *conn, "four.exam", probe), ["cccc"], "probe {probe}");
            assert_eq!(found(&mut *conn, "five.exam", probe), ["bbbb"], "probe {probe}");
            assert_eq!(found(&mut *conn, "renamed", probe), ["bbbb"], "probe {probe}");
            assert!(found(&mut *conn, "two.example", probe).is_empty(), "probe {probe}");
        }
        let count = |conn: &mut dyn Conn, sql: &str| conn.query(sql, &[]).ok().and_then(|r| r[0][0].int());
        let of_two = "SELECT count(*) FROM short_url_codes_search WHERE short_url_codes_search MATCH '\"two\"'";
        assert_eq!(count(&mut *conn, of_two), Some(0), "the old texts' entry is gone");
        let of_bbbb = "SELECT count(*) FROM short_url_search_ids WHERE code = 'bbbb'";
        assert_eq!(count(&mut *conn, of_bbbb), Some(1));
        // An update that leaves the texts alone neither deletes nor adds an index entry.
        let all = "SELECT count(*) FROM short_url_search_ids";
        let before = count(&mut *conn, all);
        link.max_visits = Some(9);
        assert_eq!(links::update(&mut *conn, &link, false).map(|c| c.is_some()), Ok(true));
        assert_eq!(count(&mut *conn, all), before);
        assert_eq!(found(&mut *conn, "renamed", links::PROBE), ["bbbb"]);
        // Many changes leave one entry.
        for i in 0..20 {
            link.title = Some(format!("Renamed {i}"));
            assert_eq!(links::update(&mut *conn, &link, false).map(|c| c.is_some()), Ok(true));
        }
        assert_eq!(count(&mut *conn, of_bbbb), Some(1));
        assert_eq!(found(&mut *conn, "renamed 19", 0), ["bbbb"]);
        assert!(found(&mut *conn, "renamed 18", 0).is_empty());
        // A purged link leaves its entry behind; when its code comes back with texts sharing its
        // trigrams, a change deletes the new link's entry, never the stale one.
        let e = crate::store::NewEntry {
            origin_url: "https://six.example/u".into(),
            expires_at: Some(5),
            ..Default::default()
        };
        assert_eq!(links::insert_committed(&mut *conn, "dddd", &e, 4), Ok(true));
        assert_eq!(conn.purge(10), Ok(1));
        let e = crate::store::NewEntry { origin_url: "https://six.example/u/again".into(), ..Default::default() };
        assert_eq!(links::insert_committed(&mut *conn, "dddd", &e, 11), Ok(true));
        let mut back = links::get(&mut *conn, "dddd").ok().flatten().unwrap_or_else(|| panic!("dddd"));
        back.origin_url = "https://seven.example/t".into();
        assert_eq!(links::update(&mut *conn, &back, false).map(|c| c.is_some()), Ok(true));
        assert_eq!(found(&mut *conn, "seven.exam", 0), ["dddd"]);
        assert!(found(&mut *conn, "u/again", 0).is_empty());
        let of_dddd = "SELECT count(*) FROM short_url_search_ids WHERE code = 'dddd'";
        assert_eq!(count(&mut *conn, of_dddd), Some(2), "the stale entry and the current one");
        // A link read before its code was purged and taken again is not the new link: a change
        // or deletion of it writes nothing, and the new link keeps its texts and index entry.
        let e = crate::store::NewEntry {
            origin_url: "https://eight.example/s".into(),
            expires_at: Some(5),
            ..Default::default()
        };
        assert_eq!(links::insert_committed(&mut *conn, "eeee", &e, 4), Ok(true));
        let mut stale = links::get(&mut *conn, "eeee").ok().flatten().unwrap_or_else(|| panic!("eeee"));
        assert_eq!(conn.purge(10), Ok(1));
        let e = crate::store::NewEntry { origin_url: "https://nine.example/r".into(), ..Default::default() };
        assert_eq!(links::insert_committed(&mut *conn, "eeee", &e, 12), Ok(true));
        stale.origin_url = "https://ten.example/q".into();
        assert_eq!(links::update(&mut *conn, &stale, false), Ok(None));
        assert_eq!(links::delete(&mut *conn, &stale, 13), Ok(false));
        let now = links::get(&mut *conn, "eeee").ok().flatten().unwrap_or_else(|| panic!("eeee"));
        assert_eq!((now.origin_url.as_str(), now.deleted_at), ("https://nine.example/r", None));
        assert_eq!(found(&mut *conn, "nine.exam", 0), ["eeee"]);
        assert!(found(&mut *conn, "ten.exam", 0).is_empty());
        let check =
            conn.execute("INSERT INTO short_url_codes_search (short_url_codes_search) VALUES ('integrity-check')", &[]);
        assert!(check.is_ok(), "{check:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
