//! Links with options, the management queries and visits, written once in the SQL both backends
//! share (see [`Conn::query`]): tables `short_url_codes`, `short_url_tags`, `short_url_visits`.

use std::collections::{HashMap, VecDeque};

use super::{Conn, NewEntry, Val};

/// The columns of a link, in [`Link::from_row`] order.
const LINK_COLS: &str = "code, origin_url, created_at, expires_at, valid_since, max_visits, cap_used, visits, \
                         bot_visits, title, tags, domain, owner, deleted_at";

/// A stored link with everything the management API shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    /// The code.
    pub code: String,
    /// Where it redirects.
    pub origin_url: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds from which it answers 410 (none: never).
    pub expires_at: Option<i64>,
    /// Unix seconds before which it answers 404.
    pub valid_since: Option<i64>,
    /// Redirects allowed (none: unlimited).
    pub max_visits: Option<i64>,
    /// Redirects counted against `max_visits` (counted at the redirect, atomically).
    pub cap_used: i64,
    /// Visits recorded (bots included).
    pub visits: i64,
    /// Of which by bots.
    pub bot_visits: i64,
    /// Title.
    pub title: Option<String>,
    /// Tags, sorted.
    pub tags: Vec<String>,
    /// Host of the short base it is shown on.
    pub domain: Option<String>,
    /// Owning consumer.
    pub owner: Option<String>,
    /// Unix seconds of its deletion (it answers 410 and its code is never reused).
    pub deleted_at: Option<i64>,
}

fn tags_text(tags: &[String]) -> Option<String> {
    (!tags.is_empty()).then(|| serde_json::to_string(tags).unwrap_or_default())
}

impl Link {
    fn from_row(r: &[Val]) -> Link {
        let int = |i: usize| r.get(i).and_then(Val::int);
        let text = |i: usize| r.get(i).and_then(Val::text);
        Link {
            code: text(0).unwrap_or_default(),
            origin_url: text(1).unwrap_or_default(),
            created_at: int(2).unwrap_or_default(),
            expires_at: int(3),
            valid_since: int(4),
            max_visits: int(5),
            cap_used: int(6).unwrap_or_default(),
            visits: int(7).unwrap_or_default(),
            bot_visits: int(8).unwrap_or_default(),
            title: text(9),
            tags: text(10).and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default(),
            domain: text(11),
            owner: text(12),
            deleted_at: int(13),
        }
    }
}

/// Who asks: everyone's links (no authentication, or an admin consumer) or one owner's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every link.
    All,
    /// The links of this consumer only.
    Owner(String),
}

impl Scope {
    /// Whether `link` is visible.
    pub fn sees(&self, link: &Link) -> bool {
        match self {
            Scope::All => true,
            Scope::Owner(o) => link.owner.as_deref() == Some(o),
        }
    }
}

/// The code of a live link of the same owner, URL and options, among the links created with
/// `find_if_exists` (only those are in the partial index on `origin_url`, so that plain creation
/// does not pay for it). Live: not deleted, not expired, not past its `max_visits` (it would
/// answer 410). With a `custom_code`, only the link of that code matches (as Shlink's
/// `findIfExists` with a custom slug): the answer is never another code than the one asked for.
/// An empty title is no title (links stored before titles were normalised hold `""`).
pub fn find_existing(conn: &mut dyn Conn, e: &NewEntry, now: i64) -> Result<Option<String>, String> {
    let rows = conn.query(
        "SELECT code FROM short_url_codes WHERE origin_url = $1 AND findable = 1 AND deleted_at IS NULL
           AND (expires_at IS NULL OR expires_at > $2)
           AND (max_visits IS NULL OR cap_used < max_visits)
           AND (CAST($9 AS TEXT) IS NULL OR code = CAST($9 AS TEXT))
           AND owner IS NOT DISTINCT FROM CAST($3 AS TEXT)
           AND valid_since IS NOT DISTINCT FROM CAST($4 AS BIGINT)
           AND max_visits IS NOT DISTINCT FROM CAST($5 AS BIGINT)
           AND coalesce(title, '') = coalesce(CAST($6 AS TEXT), '')
           AND tags IS NOT DISTINCT FROM CAST($7 AS TEXT)
           AND domain IS NOT DISTINCT FROM CAST($8 AS TEXT)
         ORDER BY created_at LIMIT 1",
        &[
            e.origin_url.as_str().into(),
            now.into(),
            e.owner.clone().into(),
            e.valid_since.into(),
            e.max_visits.into(),
            e.title.clone().into(),
            tags_text(&e.tags).into(),
            e.domain.clone().into(),
            e.custom_code.clone().into(),
        ],
    )?;
    Ok(rows.first().and_then(|r| r.first()).and_then(Val::text))
}

/// Inserts a link with all its columns unless the code exists (also deleted); whether it did.
///
/// In a transaction (`store::transaction`): the link is indexed for search when it commits.
pub fn insert_full(conn: &mut dyn Conn, code: &str, e: &NewEntry, now: i64) -> Result<bool, String> {
    let n = conn.execute(
        "INSERT INTO short_url_codes (code, origin_url, created_at, expires_at, valid_since, max_visits, title, tags, domain, owner, findable)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (code) DO NOTHING",
        &[
            code.into(),
            e.origin_url.as_str().into(),
            now.into(),
            e.expires_at.into(),
            e.valid_since.into(),
            e.max_visits.into(),
            e.title.clone().into(),
            tags_text(&e.tags).into(),
            e.domain.clone().into(),
            e.owner.clone().into(),
            e.find_if_exists.then_some(1i64).into(),
        ],
    )?;
    if n == 1 {
        set_tags(conn, code, &e.tags)?;
    }
    Ok(n == 1)
}

/// [`insert_full`] in a transaction of its own (tests and the search fuzz target).
pub fn insert_committed(conn: &mut dyn Conn, code: &str, e: &NewEntry, now: i64) -> Result<bool, String> {
    super::transaction(conn, |conn| insert_full(conn, code, e, now))
}

fn set_tags(conn: &mut dyn Conn, code: &str, tags: &[String]) -> Result<(), String> {
    conn.execute("DELETE FROM short_url_tags WHERE code = $1", &[code.into()])?;
    for t in tags {
        conn.execute(
            "INSERT INTO short_url_tags (tag, code) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[t.as_str().into(), code.into()],
        )?;
    }
    Ok(())
}

/// The link of a code, deleted or not.
pub fn get(conn: &mut dyn Conn, code: &str) -> Result<Option<Link>, String> {
    let rows = conn.query(&format!("SELECT {LINK_COLS} FROM short_url_codes WHERE code = $1"), &[code.into()])?;
    Ok(rows.first().map(|r| Link::from_row(r)))
}

/// Counts one redirect of a capped link, atomically: whether it was still under `max_visits`.
/// Two gateways on one database never let more than `max_visits` through together.
pub fn hit(conn: &mut dyn Conn, code: &str) -> Result<bool, String> {
    let rows = conn.query(
        "UPDATE short_url_codes SET cap_used = cap_used + 1
         WHERE code = $1 AND deleted_at IS NULL AND max_visits IS NOT NULL AND cap_used < max_visits
         RETURNING cap_used",
        &[code.into()],
    )?;
    Ok(!rows.is_empty())
}

/// Order of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Newest first (default).
    #[default]
    CreatedDesc,
    /// Oldest first.
    CreatedAsc,
    /// Most visited first.
    VisitsDesc,
    /// Least visited first.
    VisitsAsc,
}

/// A list request, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// 1-based page.
    pub page: u32,
    /// Links per page.
    pub page_size: u32,
    /// Substring of origin_url, title or tags (case-insensitive).
    pub search: Option<String>,
    /// Links with this tag.
    pub tag: Option<String>,
    /// Created at or after (Unix seconds).
    pub since: Option<i64>,
    /// Created before (Unix seconds).
    pub until: Option<i64>,
    /// Order.
    pub order: Order,
}

impl Default for ListQuery {
    fn default() -> Self {
        ListQuery { page: 1, page_size: 20, search: None, tag: None, since: None, until: None, order: Order::default() }
    }
}

/// A page of links, and whether more follow.
///
/// A search of 3 characters or more can go three ways. First each of the term's trigrams is
/// probed in the trigram index, counting at most [`PROBE`] links: when one is rarer than that,
/// the index on that trigram alone gives few candidates and the `ILIKE` test picks the matches
/// among them (`site7.example` at 1M links: 771 candidates, 5 ms, where the phrase of its 11
/// trigrams, most of them in every URL, took 24-40 ms inside FTS5). When every trigram is
/// common, neither remaining way's cost is known in advance: the index on all its trigrams goes
/// first within [`INDEX_FIRST`] steps, then a walk of the list's order that tests each link and
/// stops at the page's end within [`WALK`], then the index without a limit. The `ILIKE` test
/// decides in every case: the answer is the same whichever way it came.
pub fn list(conn: &mut dyn Conn, q: &ListQuery, scope: &Scope) -> Result<(Vec<Link>, bool), String> {
    list_within(conn, q, scope, PROBE, INDEX_FIRST, WALK).map(|(links, more, _)| (links, more))
}

/// Which way a page of links was found ([`list`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// No index to choose (no search, a short term, or PostgreSQL's own planner).
    Plain,
    /// The trigram index on the term's rarest trigram (in fewer than [`PROBE`] links).
    Rare,
    /// The trigram index on all the term's trigrams, within its first budget.
    Index,
    /// The walk of the list's order.
    Walk,
    /// The index again, without a limit, after both budgets ran out.
    IndexAfterWalk,
    /// PostgreSQL: the codes the texts' trigram index found (at most [`FOUND`]), then the list's
    /// filters and order over those alone.
    Found,
    /// PostgreSQL: a prefix of the list's order held the page (a common term), or every link
    /// was tested.
    Common,
}

/// How many codes a PostgreSQL search takes from the texts' index before it counts the term
/// as common (at 1M links, 0.2% of them hold it: a walk of the list's order fills a page of 20
/// within about 10,000 links). Below it the page is sorted from the codes found. The probe
/// tests each text it reads, so a larger limit costs a common term more: with 5,000, a term in
/// 11% of 360,000 links took 82 ms to probe and 7 ms to walk.
pub const FOUND: i64 = 2000;

/// An `ILIKE` pattern matching `term` anywhere, its `\`, `%` and `_` taken literally.
fn like_pattern(term: &str) -> String {
    format!("%{}%", term.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))
}

/// The search test on a link's texts, the `ILIKE` pattern bound at `pattern` (see
/// [`like_pattern`]).
fn texts_match(pattern: &str) -> String {
    format!("origin_url ILIKE {pattern} ESCAPE '\\' OR title ILIKE {pattern} ESCAPE '\\' OR tags ILIKE {pattern} ESCAPE '\\'")
}

/// How a page of links is narrowed to a search's matches, besides the `ILIKE` test on the
/// links' texts ([`list_sql`]).
#[derive(Clone, Copy)]
enum Narrow<'a> {
    /// By nothing: the test alone, on every link in the list's order.
    Scan,
    /// SQLite: through the FTS5 index, by this FTS5 query (which every match satisfies).
    Fts(&'a str),
    /// PostgreSQL: to these codes (comma-separated: codes hold no comma).
    Codes(&'a str),
    /// PostgreSQL: the test on the first links of the list's order only (of the owner's links
    /// for an owner's list; deleted or filtered out or not): the matches among them are the
    /// first matches of all.
    Prefix(i64),
}

/// [`list`] with the probe's limit and the budgets given.
pub fn list_within(
    conn: &mut dyn Conn,
    q: &ListQuery,
    scope: &Scope,
    probe: i64,
    index_first: u32,
    walk: u32,
) -> Result<(Vec<Link>, bool, Way), String> {
    if q.search.as_deref().is_some_and(|s| s.chars().any(char::is_control)) {
        // No stored text holds one (creation and PATCH refuse them), and FTS5 ends a query at NUL.
        return Ok((Vec::new(), false, Way::Plain));
    }
    let trigram_term = q.search.as_deref().filter(|s| s.chars().count() >= 3);
    let (rows, way) = match trigram_term {
        Some(term) if conn.search_texts() => search_texts(conn, q, scope, term)?,
        Some(term) if conn.search_index("$1").is_some() => match rarest_trigram(conn, term, probe)? {
            Some((_, trigram)) => {
                let (sql, params) = list_sql(conn, q, scope, Narrow::Fts(&trigram));
                (conn.query(&sql, &params)?, Way::Rare)
            }
            None => {
                let all = super::fts_all_trigrams(term);
                let (by_index, params) = list_sql(conn, q, scope, Narrow::Fts(&all));
                match conn.query_within(&by_index, &params, index_first)? {
                    Some(rows) => (rows, Way::Index),
                    None => {
                        let (walk_sql, walk_params) = list_sql(conn, q, scope, Narrow::Scan);
                        match conn.query_within(&walk_sql, &walk_params, walk)? {
                            Some(rows) => (rows, Way::Walk),
                            None => (conn.query(&by_index, &params)?, Way::IndexAfterWalk),
                        }
                    }
                }
            }
        },
        _ => {
            let (sql, params) = list_sql(conn, q, scope, Narrow::Scan);
            (conn.query(&sql, &params)?, Way::Plain)
        }
    };
    let mut links: Vec<Link> = rows.iter().map(|r| Link::from_row(r)).collect();
    let more = links.len() > q.page_size as usize;
    links.truncate(q.page_size as usize);
    Ok((links, more, way))
}

/// PostgreSQL's search ([`list`]): three ways, each exact, tried from the cheapest, so that no
/// choice rests on the planner's guess of how many links hold the term (a single statement
/// was a lottery: 0.9 to 1.5 s for terms it misjudged, at 300,000 links).
/// 1. The newest (or most visited) [`PREFIX`] links in the list's order (the owner's, for an
///    owner's list), tested: when they hold
///    the whole page, it is the page (a common term, an early page).
/// 2. The texts' trigram index, with sequential scans off, for at most [`FOUND`] + 1 codes:
///    when it finds no more than [`FOUND`], the page is sorted from those (a rare term).
/// 3. Prefixes of 10 and 100 times [`PREFIX`] links, then every link (a term in more than
///    [`FOUND`] links, or a deep page).
fn search_texts(conn: &mut dyn Conn, q: &ListQuery, scope: &Scope, term: &str) -> Result<(Vec<Vec<Val>>, Way), String> {
    let (sql, params) = list_sql(conn, q, scope, Narrow::Prefix(PREFIX));
    let rows = conn.query_planned(&sql, &params)?;
    if rows.len() > q.page_size as usize {
        return Ok((rows, Way::Common));
    }
    let found = super::transaction(conn, |conn| {
        conn.exec("SET LOCAL enable_seqscan = off")?;
        conn.query_planned(
            &format!("SELECT code FROM short_url_search WHERE {} LIMIT $2", texts_match("$1")),
            &[like_pattern(term).into(), (FOUND + 1).into()],
        )
    })?;
    if found.len() as i64 <= FOUND {
        let codes: Vec<String> = found.iter().filter_map(|r| r.first().and_then(Val::text)).collect();
        let (sql, params) = list_sql(conn, q, scope, Narrow::Codes(&codes.join(",")));
        return Ok((conn.query_planned(&sql, &params)?, Way::Found));
    }
    for prefix in [PREFIX * 10, PREFIX * 100] {
        let (sql, params) = list_sql(conn, q, scope, Narrow::Prefix(prefix));
        let rows = conn.query_planned(&sql, &params)?;
        if rows.len() > q.page_size as usize {
            return Ok((rows, Way::Common));
        }
    }
    let (sql, params) = list_sql(conn, q, scope, Narrow::Scan);
    Ok((conn.query_planned(&sql, &params)?, Way::Common))
}

/// Links of the list's order a PostgreSQL search tests first (see [`list`]).
pub const PREFIX: i64 = 1000;

/// Links a trigram is counted in at most by `rarest_trigram`'s probe (about 0.1 ms each).
pub const PROBE: i64 = 1000;

/// How long a probe's count is reused. Counts only steer the choice of a way (the `ILIKE` test
/// decides the answer), and the trigrams most terms share (`htt`, `exa`, `.co`...) stay common:
/// without the cache a term of 9 common trigrams spent 1 ms probing per search.
const PROBE_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// Probe counts by (trigram query, limit), with when they were taken: one per connection (so
/// per database), cleared when it reaches 4,096 entries.
pub type ProbeCache = std::collections::HashMap<(String, i64), (i64, std::time::Instant)>;

/// In how many links (at most `probe`) the FTS5 `query` of one trigram is, from the
/// connection's cache when it was counted less than [`PROBE_TTL`] ago.
fn probe_count(conn: &mut dyn Conn, query: &str, probe: i64) -> Result<i64, String> {
    let key = (query.to_owned(), probe);
    if let Some((n, at)) = conn.probe_cache().and_then(|m| m.get(&key).copied()) {
        if at.elapsed() < PROBE_TTL {
            return Ok(n);
        }
    }
    let rows = conn.query(
        "SELECT count(*) FROM (SELECT rowid FROM short_url_codes_search WHERE short_url_codes_search MATCH $1 LIMIT $2)",
        &[query.into(), probe.into()],
    )?;
    let n = rows.first().and_then(|r| r.first()).and_then(Val::int).unwrap_or(probe);
    if let Some(cache) = conn.probe_cache() {
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert(key, (n, std::time::Instant::now()));
    }
    Ok(n)
}

/// How many links hold `term`'s rarest trigram, and its FTS5 query, when some trigram is in
/// fewer than `probe` links (a trigram in none: the term is in no link).
fn rarest_trigram(conn: &mut dyn Conn, term: &str, probe: i64) -> Result<Option<(i64, String)>, String> {
    if probe <= 0 {
        return Ok(None);
    }
    let mut best: Option<(i64, String)> = None;
    for trigram in super::trigrams(term) {
        let query = super::fts_trigram(&trigram);
        let n = probe_count(conn, &query, probe)?;
        if n < probe && best.as_ref().is_none_or(|(b, _)| n < *b) {
            best = Some((n, query));
            if n == 0 {
                break;
            }
        }
    }
    Ok(best)
}

/// Thousands of SQLite program steps a search spends on the trigram index before it tries the
/// ordered walk. At 1M links (`benches/short_url_manage.sh`) a rare term's page takes 1k-6k
/// steps this way (1-3 ms); a term whose trigrams are in every URL takes far more, most of it
/// inside FTS5 (`site7.example`: 64k steps, 50 ms; `example`: 37M steps, 2 s).
pub const INDEX_FIRST: u32 = 20;
/// Thousands of steps the ordered walk may take (about 40 ns each) before the index is asked
/// again without a limit: `site7.example` (946 matches) finds its page in 293k steps (12 ms);
/// a term matching nothing would scan all links (14M steps).
pub const WALK: u32 = 500;

/// The statement of a page of links, its search narrowed as `narrow` says.
fn list_sql(conn: &dyn Conn, q: &ListQuery, scope: &Scope, narrow: Narrow<'_>) -> (String, Vec<Val>) {
    let order = match q.order {
        Order::CreatedDesc => "created_at DESC, code DESC",
        Order::CreatedAsc => "created_at, code",
        Order::VisitsDesc => "visits DESC, code DESC",
        Order::VisitsAsc => "visits, code",
    };
    let mut params: Vec<Val> = Vec::new();
    fn bind(params: &mut Vec<Val>, v: Val) -> String {
        params.push(v);
        format!("${}", params.len())
    }
    let owner = match scope {
        Scope::Owner(o) => format!(" AND owner = {}", bind(&mut params, o.as_str().into())),
        Scope::All => String::new(),
    };
    // An owner's prefix is of its own links (the `(owner, created_at|visits, code)` indexes):
    // a search by one owner then costs what its own links do, not what everyone's do.
    let mut sql = match narrow {
        Narrow::Prefix(n) => format!(
            "SELECT {LINK_COLS} FROM (SELECT * FROM short_url_codes WHERE TRUE{owner} ORDER BY {order} LIMIT {n})
             AS short_url_codes WHERE deleted_at IS NULL"
        ),
        _ => format!("SELECT {LINK_COLS} FROM short_url_codes WHERE deleted_at IS NULL{owner}"),
    };
    if let Some(s) = &q.search {
        let p = bind(&mut params, like_pattern(s).into());
        sql.push_str(&format!(" AND ({})", texts_match(&p)));
        match narrow {
            Narrow::Scan | Narrow::Prefix(_) => {}
            Narrow::Fts(query) => {
                let phrase = bind(&mut params, query.into());
                if let Some(cond) = conn.search_index(&phrase) {
                    sql.push_str(" AND ");
                    sql.push_str(&cond);
                } else {
                    params.pop();
                }
            }
            Narrow::Codes(codes) => {
                let list = bind(&mut params, codes.into());
                sql.push_str(&format!(" AND code = ANY(string_to_array({list}, ','))"));
            }
        }
    }
    if let Some(t) = &q.tag {
        let p = bind(&mut params, t.as_str().into());
        sql.push_str(&format!(" AND code IN (SELECT code FROM short_url_tags WHERE tag = {p})"));
    }
    if let Some(t) = q.since {
        let p = bind(&mut params, t.into());
        sql.push_str(&format!(" AND created_at >= {p}"));
    }
    if let Some(t) = q.until {
        let p = bind(&mut params, t.into());
        sql.push_str(&format!(" AND created_at < {p}"));
    }
    sql.push_str(" ORDER BY ");
    sql.push_str(order);
    let limit = bind(&mut params, i64::from(q.page_size + 1).into());
    let offset = bind(&mut params, (i64::from(q.page.saturating_sub(1)) * i64::from(q.page_size)).into());
    sql.push_str(&format!(" LIMIT {limit} OFFSET {offset}"));
    (sql, params)
}

/// Writes the changeable fields of `link` (origin_url, validity, max_visits, tags, title); the
/// visits counted for its cap afterwards (`None`: no such live link). Only the link `link` was
/// read from is written: a code purged and taken again by another owner's link in between has
/// another `created_at`.
///
/// A cap set on a link that had none starts from the visits the link already has (less its
/// bots' when `exclude_bots`), as Shlink compares `maxVisits` with every visit: a link already
/// past its new cap answers 410 at once. (Redirects of an uncapped link count nothing toward a
/// cap, which keeps them free of a database write.)
pub fn update(conn: &mut dyn Conn, link: &Link, exclude_bots: bool) -> Result<Option<i64>, String> {
    super::transaction(conn, |conn| {
        forget_indexed_texts(conn, link)?;
        let rows = conn.query(
            "UPDATE short_url_codes SET origin_url = $2, expires_at = $3, valid_since = $4,
                 cap_used = CASE WHEN max_visits IS NULL AND CAST($5 AS BIGINT) IS NOT NULL
                                 THEN visits - CASE WHEN CAST($8 AS BIGINT) = 1 THEN bot_visits ELSE 0 END
                                 ELSE cap_used END,
                 max_visits = $5, title = $6, tags = $7
             WHERE code = $1 AND created_at = $9 AND deleted_at IS NULL
             RETURNING cap_used",
            &[
                link.code.as_str().into(),
                link.origin_url.as_str().into(),
                link.expires_at.into(),
                link.valid_since.into(),
                link.max_visits.into(),
                link.title.clone().into(),
                tags_text(&link.tags).into(),
                i64::from(exclude_bots).into(),
                link.created_at.into(),
            ],
        )?;
        let cap_used = rows.first().and_then(|r| r.first()).and_then(Val::int);
        if cap_used.is_some() {
            set_tags(conn, &link.code, &link.tags)?;
        }
        Ok(cap_used)
    })
}

/// Before `link`'s texts (origin_url, title, tags) change, removes their entry from the trigram
/// index where there is one (SQLite; the update's trigger lists the new texts, indexed when the
/// transaction commits). The index is
/// contentless: an entry is deleted by giving its texts again, and it is found through the index
/// itself, by the rarest trigram of the old texts. A code's current entry is its newest `search_ids`
/// row; older ones (of a purged link whose code came back) are left alone, since their texts
/// are not known.
fn forget_indexed_texts(conn: &mut dyn Conn, link: &Link) -> Result<(), String> {
    if conn.search_index("$1").is_none() {
        return Ok(());
    }
    // The link's current entry may still wait to be indexed (written earlier in this
    // transaction, or without one).
    conn.index_pending()?;
    // (This very link: a code purged and taken again since `link` was read is another link,
    // whose entry stays, as the guarded `UPDATE` after this leaves it alone.)
    let rows = conn.query(
        "SELECT origin_url, title, tags FROM short_url_codes WHERE code = $1 AND created_at = $2 AND deleted_at IS NULL",
        &[link.code.as_str().into(), link.created_at.into()],
    )?;
    let Some(old) = rows.into_iter().next() else { return Ok(()) };
    let new = [Val::from(link.origin_url.as_str()), link.title.clone().into(), tags_text(&link.tags).into()];
    if old[..] == new[..] {
        // The trigger adds no entry either.
        return Ok(());
    }
    // The rarest trigram of any of the old texts (a title or tag is often rarer than a URL);
    // when all are common, the AND of the URL's.
    let mut rarest: Option<(i64, String)> = None;
    for text in old.iter().filter_map(Val::text) {
        if let Some(found) = rarest_trigram(conn, &text, PROBE)? {
            if rarest.as_ref().is_none_or(|(n, _)| found.0 < *n) {
                rarest = Some(found);
            }
        }
    }
    let query = match rarest {
        Some((_, query)) => query,
        None => super::fts_all_trigrams(&old[0].text().unwrap_or_default()),
    };
    if query.is_empty() {
        return Ok(());
    }
    // The code's newest entry among the matches. The code's current entry holds every trigram of
    // the old texts, so it is among them, and it is the newest of its code (a purged link's
    // entries are older): no scan of `search_ids` by code, which has no index. CROSS JOIN keeps
    // the FTS matches as the outer loop, each looked up by rowid.
    let newest = conn.query(
        "SELECT max(s.id) FROM (SELECT rowid AS id FROM short_url_codes_search
                                WHERE short_url_codes_search MATCH $2) AS m
             CROSS JOIN short_url_search_ids AS s ON s.id = m.id
         WHERE s.code = $1",
        &[link.code.as_str().into(), query.into()],
    )?;
    let Some(id) = newest.first().and_then(|r| r.first()).and_then(Val::int) else {
        return Ok(());
    };
    let [url, title, tags] = <[Val; 3]>::try_from(old).map_err(|_| "a link row of 3 columns".to_owned())?;
    conn.execute(
        "INSERT INTO short_url_codes_search (short_url_codes_search, rowid, origin_url, title, tags)
         VALUES ('delete', $1, $2, $3, $4)",
        &[id.into(), url, title, tags],
    )?;
    conn.execute("DELETE FROM short_url_search_ids WHERE id = $1", &[id.into()])?;
    Ok(())
}

/// Marks `link` deleted (kept as a tombstone, so that its code is never handed out again):
/// that very link, as [`update`] writes only the link it read.
pub fn delete(conn: &mut dyn Conn, link: &Link, now: i64) -> Result<bool, String> {
    let n = conn.execute(
        "UPDATE short_url_codes SET deleted_at = $2 WHERE code = $1 AND created_at = $3 AND deleted_at IS NULL",
        &[link.code.as_str().into(), now.into(), link.created_at.into()],
    )?;
    Ok(n == 1)
}

/// User-agent class of a visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UaClass {
    /// A browser (`Mozilla/` and no crawler token).
    Browser,
    /// A crawler or link previewer.
    Bot,
    /// Anything else: scripts, tools, no user-agent.
    Other,
}

impl UaClass {
    /// Its name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            UaClass::Browser => "browser",
            UaClass::Bot => "bot",
            UaClass::Other => "other",
        }
    }
}

/// One recorded visit, as buffered (the client IP is already hashed).
#[derive(Debug, Clone)]
pub struct Visit {
    /// The code.
    pub code: String,
    /// Unix seconds.
    pub at: i64,
    /// Host of the `Referer`, lower case.
    pub referer: Option<String>,
    /// User-agent class.
    pub class: UaClass,
    /// ISO country code (only with a GeoIP database; not implemented: always none).
    pub country: Option<String>,
    /// Salted hash of the client IP, hex.
    pub ip_hash: u64,
}

/// Rows per multi-row INSERT (at most 6 parameters each).
const ROWS_PER_INSERT: usize = 100;

/// Visit rows kept per code and flush: the newest this many of a batch; the others are only
/// counted (in `short_url_visit_stats` and the link's counters).
pub const RECENT_PER_CODE: usize = 20;

/// Visit rows kept per code by default (`visits.keep_recent`): the page of recent visits reaches
/// back this far at least. Counts and the per-day series stay exact whatever is pruned.
pub const DEFAULT_KEEP_RECENT: i64 = 1000;

/// Visit rows a prune deletes at most, oldest first: rows a code holds beyond its bound since
/// before the bound existed go over several flushes, never in one long write.
pub const PRUNE_AT_MOST: i64 = 10_000;

/// Visits folded in memory until they are written: a count per (code, day, class, referer
/// host), each code's totals, and each code's newest [`RECENT_PER_CODE`] visits. However many
/// visits a hot code gets, it folds into a few rows; only distinct keys grow the batch.
#[derive(Default)]
pub struct VisitBatch {
    /// Codes in order of first arrival, with their totals and newest visits.
    codes: Vec<CodeVisits>,
    /// Code -> its index in `codes`.
    code_index: HashMap<String, usize>,
    /// Referer host -> its index in `referers` (interned: a key then holds no string).
    referer_index: HashMap<String, usize>,
    referers: Vec<String>,
    /// (code index, day, class, referer index or `NO_REFERER`) -> visits.
    stats: HashMap<(usize, i64, UaClass, usize), i64>,
    visits: u64,
}

struct CodeVisits {
    code: String,
    visits: i64,
    bots: i64,
    /// The newest visits, oldest first.
    recent: VecDeque<Visit>,
}

const NO_REFERER: usize = usize::MAX;

impl VisitBatch {
    /// Folds one visit in; allocates only for a code or referer host the batch has not seen.
    pub fn add(&mut self, v: Visit) {
        self.visits += 1;
        let code = match self.code_index.get(v.code.as_str()) {
            Some(&i) => i,
            None => {
                let i = self.codes.len();
                self.code_index.insert(v.code.clone(), i);
                self.codes.push(CodeVisits { code: v.code.clone(), visits: 0, bots: 0, recent: VecDeque::new() });
                i
            }
        };
        let referer = match v.referer.as_deref() {
            None => NO_REFERER,
            Some(host) => match self.referer_index.get(host) {
                Some(&r) => r,
                None => {
                    let r = self.referers.len();
                    self.referer_index.insert(host.to_owned(), r);
                    self.referers.push(host.to_owned());
                    r
                }
            },
        };
        *self.stats.entry((code, v.at.div_euclid(86_400), v.class, referer)).or_default() += 1;
        let c = &mut self.codes[code];
        c.visits += 1;
        c.bots += i64::from(v.class == UaClass::Bot);
        if c.recent.len() == RECENT_PER_CODE {
            c.recent.pop_front();
        }
        c.recent.push_back(v);
    }

    /// Rows of `short_url_visit_stats` the batch would write: what bounds its size.
    pub fn keys(&self) -> usize {
        self.stats.len()
    }

    /// Visits folded in.
    pub fn visits(&self) -> u64 {
        self.visits
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.codes.clear();
        self.code_index.clear();
        self.referer_index.clear();
        self.referers.clear();
        self.stats.clear();
        self.visits = 0;
    }
}

/// Writes a batch of visits in one transaction: one UPSERT per (code, day, class, referer host)
/// into `short_url_visit_stats`, one counter UPDATE per 100 codes, and a visit row for each code's
/// newest [`RECENT_PER_CODE`] visits (the page of recent visits is a sample; counts, the
/// per-day series and totals are exact). After a crash either all of the batch is there or
/// none of it, and the counters always equal the aggregates.
///
/// A code's visit rows are bounded: when its visit count passes a multiple of `keep` (at least
/// [`RECENT_PER_CODE`]), its rows older than its newest `keep` are deleted (at most
/// [`PRUNE_AT_MOST`] per flush). A code thus holds fewer than `2 * keep + RECENT_PER_CODE` rows,
/// where a hot code used to gain 20 rows every flush forever; a code with few visits is never
/// looked at, so visits to many distinct codes cost nothing more.
pub fn flush_visits(conn: &mut dyn Conn, batch: &VisitBatch, keep: i64) -> Result<(), String> {
    let keep = keep.max(RECENT_PER_CODE as i64);
    let recent: Vec<&Visit> = batch.codes.iter().flat_map(|c| &c.recent).collect();
    // Every write in a fixed order (by code), so that two instances' flushes take row locks in
    // the same order and never deadlock on PostgreSQL.
    let mut stats: Vec<_> = batch.stats.iter().collect();
    stats.sort_unstable_by(|(a, _), (b, _)| {
        (batch.codes[a.0].code.as_str(), a.1, a.2.as_str(), batch.referers.get(a.3)).cmp(&(
            batch.codes[b.0].code.as_str(),
            b.1,
            b.2.as_str(),
            batch.referers.get(b.3),
        ))
    });
    let mut counters: Vec<&CodeVisits> = batch.codes.iter().collect();
    counters.sort_unstable_by(|a, b| a.code.cmp(&b.code));
    super::transaction(conn, |conn| {
        for chunk in recent.chunks(ROWS_PER_INSERT) {
            let mut params = Vec::with_capacity(chunk.len() * 6);
            for v in chunk {
                params.extend([
                    v.code.as_str().into(),
                    v.at.into(),
                    v.referer.clone().into(),
                    v.class.as_str().into(),
                    v.country.clone().into(),
                    format!("{:016x}", v.ip_hash).into(),
                ]);
            }
            let sql = format!(
                "INSERT INTO short_url_visits (code, at, referer, ua_class, country, ip_hash) VALUES {}",
                placeholders(chunk.len(), &[""; 6])
            );
            conn.execute(&sql, &params)?;
        }
        for chunk in stats.chunks(ROWS_PER_INSERT) {
            let mut params = Vec::with_capacity(chunk.len() * 5);
            for ((code, day, class, referer), n) in chunk {
                let referer = batch.referers.get(*referer).map_or("", String::as_str);
                params.extend([
                    batch.codes[*code].code.as_str().into(),
                    (*day).into(),
                    class.as_str().into(),
                    referer.into(),
                    (**n).into(),
                ]);
            }
            let sql = format!(
                "INSERT INTO short_url_visit_stats (code, day, ua_class, referer, n) VALUES {}
                 ON CONFLICT (code, day, ua_class, referer) DO UPDATE SET n = short_url_visit_stats.n + excluded.n",
                placeholders(chunk.len(), &[""; 5])
            );
            conn.execute(&sql, &params)?;
        }
        // One UPDATE per chunk of codes, joined to its counts (not one round trip per code): on
        // PostgreSQL the row locks follow the VALUES order, which is sorted.
        // Each code's count after the update tells whether it passed a multiple of `keep`.
        let mut to_prune = Vec::new();
        for chunk in counters.chunks(ROWS_PER_INSERT) {
            let mut params = Vec::with_capacity(chunk.len() * 3);
            for c in chunk {
                params.extend([c.code.as_str().into(), c.visits.into(), c.bots.into()]);
            }
            let rows = placeholders(chunk.len(), &["TEXT", "BIGINT", "BIGINT"]);
            let sql = format!(
                "UPDATE short_url_codes SET visits = visits + v.column2, bot_visits = bot_visits + v.column3
                 FROM (VALUES {rows}) AS v WHERE short_url_codes.code = v.column1
                 RETURNING code, visits"
            );
            // (SQLite's RETURNING sees only the updated table: what was added comes from the
            // chunk, sorted by code.)
            for row in conn.query(&sql, &params)? {
                let (Some(code), Some(after)) = (row.first().and_then(Val::text), row.get(1).and_then(Val::int)) else {
                    continue;
                };
                let Ok(i) = chunk.binary_search_by(|c| c.code.as_str().cmp(&code)) else { continue };
                if (after - chunk[i].visits).div_euclid(keep) != after.div_euclid(keep) {
                    to_prune.push(code);
                }
            }
        }
        to_prune.sort_unstable();
        for code in &to_prune {
            prune_visit_rows(conn, code, keep)?;
        }
        Ok(())
    })
}

/// Deletes the visit rows of `code` older than its newest `keep` (at most [`PRUNE_AT_MOST`],
/// oldest first), through the `(code, at)` index.
fn prune_visit_rows(conn: &mut dyn Conn, code: &str, keep: i64) -> Result<(), String> {
    let kept_last = conn.query(
        "SELECT at, id FROM short_url_visits WHERE code = $1 ORDER BY at DESC, id DESC LIMIT 1 OFFSET $2",
        &[code.into(), (keep - 1).into()],
    )?;
    let Some((at, id)) = kept_last.first().and_then(|r| Some((r.first()?.int()?, r.get(1)?.int()?))) else {
        return Ok(());
    };
    conn.execute(
        "DELETE FROM short_url_visits WHERE id IN (
             SELECT id FROM short_url_visits WHERE code = $1 AND (at < $2 OR (at = $2 AND id < $3))
             ORDER BY at, id LIMIT $4)",
        &[code.into(), at.into(), id.into(), PRUNE_AT_MOST.into()],
    )?;
    Ok(())
}

/// `($1, .., $width), ($width+1, ..), ..` for `rows` rows of `casts.len()` columns; a column
/// whose cast is not empty reads `CAST($n AS type)` (PostgreSQL infers no type for a bare
/// parameter in a `VALUES` list that is not inserted anywhere).
fn placeholders(rows: usize, casts: &[&str]) -> String {
    use std::fmt::Write;
    let width = casts.len();
    let mut sql = String::with_capacity(rows * width * 5);
    for i in 0..rows {
        sql.push_str(if i > 0 { ",(" } else { "(" });
        for (j, cast) in casts.iter().enumerate() {
            let n = i * width + j + 1;
            let _ = match *cast {
                "" => write!(sql, "{}${n}", if j > 0 { ", " } else { "" }),
                ty => write!(sql, "{}CAST(${n} AS {ty})", if j > 0 { ", " } else { "" }),
            };
        }
        sql.push(')');
    }
    sql
}

/// What `GET /short/v1/urls/{code}/visits` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// (day as Unix seconds / 86400, visits, of which bots), oldest first.
    pub days: Vec<(i64, i64, i64)>,
    /// (referer host or "" for none, visits), most first.
    pub referers: Vec<(String, i64)>,
    /// (class, visits).
    pub classes: Vec<(String, i64)>,
    /// A page of visits, newest first.
    pub recent: Vec<Recent>,
}

/// A recorded visit as read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recent {
    /// Unix seconds.
    pub at: i64,
    /// Referer host.
    pub referer: Option<String>,
    /// User-agent class.
    pub ua_class: String,
    /// Country.
    pub country: Option<String>,
    /// IP hash, hex.
    pub ip_hash: String,
}

/// The visit report of a code: the last `days` days, and page `page` of recent visits.
pub fn report(
    conn: &mut dyn Conn,
    code: &str,
    days: i64,
    page: u32,
    page_size: u32,
    now: i64,
) -> Result<Report, String> {
    let from = (now / 86_400 - days + 1) * 86_400;
    let rows = conn.query(
        "SELECT day, CAST(sum(n) AS BIGINT), CAST(sum(CASE WHEN ua_class = 'bot' THEN n ELSE 0 END) AS BIGINT)
         FROM short_url_visit_stats WHERE code = $1 AND day >= $2 GROUP BY day ORDER BY day",
        &[code.into(), (from / 86_400).into()],
    )?;
    let int = |r: &Vec<Val>, i: usize| r.get(i).and_then(Val::int).unwrap_or_default();
    let days = rows.iter().map(|r| (int(r, 0), int(r, 1), int(r, 2))).collect();
    let rows = conn.query(
        "SELECT referer, CAST(sum(n) AS BIGINT) FROM short_url_visit_stats WHERE code = $1
         GROUP BY referer ORDER BY sum(n) DESC, referer LIMIT 50",
        &[code.into()],
    )?;
    let referers = rows.iter().map(|r| (r.first().and_then(Val::text).unwrap_or_default(), int(r, 1))).collect();
    let rows = conn.query(
        "SELECT ua_class, CAST(sum(n) AS BIGINT) FROM short_url_visit_stats WHERE code = $1
         GROUP BY ua_class ORDER BY ua_class",
        &[code.into()],
    )?;
    let classes = rows.iter().map(|r| (r.first().and_then(Val::text).unwrap_or_default(), int(r, 1))).collect();
    let rows = conn.query(
        "SELECT at, referer, ua_class, country, ip_hash FROM short_url_visits WHERE code = $1
         ORDER BY at DESC, id DESC LIMIT $2 OFFSET $3",
        &[code.into(), i64::from(page_size).into(), (i64::from(page.saturating_sub(1)) * i64::from(page_size)).into()],
    )?;
    let text = |r: &Vec<Val>, i: usize| r.get(i).and_then(Val::text);
    let recent = rows
        .iter()
        .map(|r| Recent {
            at: int(r, 0),
            referer: text(r, 1),
            ua_class: text(r, 2).unwrap_or_default(),
            country: text(r, 3),
            ip_hash: text(r, 4).unwrap_or_default(),
        })
        .collect();
    Ok(Report { days, referers, classes, recent })
}

/// Whether a search for `term` finds `code` (created at `at`, alone in that second), each way a
/// search can go: the rarest trigram, the AND of all trigrams, the ordered walk. `Err` says
/// which way missed it or failed.
fn search_finds(conn: &mut dyn Conn, code: &str, term: &str, at: i64) -> Result<(), String> {
    let q = ListQuery { search: Some(term.to_owned()), since: Some(at), until: Some(at + 1), ..ListQuery::default() };
    for (probe, index_first, walk) in [(PROBE, u32::MAX, u32::MAX), (0, u32::MAX, u32::MAX), (0, 0, u32::MAX)] {
        let (links, _, way) = list_within(conn, &q, &Scope::All, probe, index_first, walk)?;
        if !links.iter().any(|l| l.code == code) {
            return Err(format!("{term:?} did not find {code} ({way:?})"));
        }
    }
    Ok(())
}

/// Fuzzing (target `short_url_search`): a link titled with `data` (after its first byte), then a
/// search for a piece of that title (where the first byte says). Whatever the characters (FTS5
/// syntax, quotes, `%` and `_`, any script), the search finds the link every way it can go, and
/// never fails.
pub fn fuzz_search(data: &[u8]) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static STORE: std::sync::OnceLock<parking_lot::Mutex<Box<dyn Conn>>> = std::sync::OnceLock::new();
    static NEXT: AtomicI64 = AtomicI64::new(1);
    let Some((&cut, rest)) = data.split_first() else { return };
    let title = String::from_utf8_lossy(rest);
    let chars: Vec<char> = title.chars().collect();
    if chars.len() < 3 || title.len() > 256 || title.chars().any(char::is_control) {
        return;
    }
    let start = usize::from(cut & 15) % (chars.len() - 2);
    let end = start + 3 + usize::from(cut >> 4) % (chars.len() - start - 2);
    let term: String = chars[start..end].iter().collect();
    let store = STORE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("weir-fuzz-search-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let conn = super::Connector::connect(&super::sqlite::Sqlite::new(dir.join("t.db")));
        parking_lot::Mutex::new(conn.unwrap_or_else(|e| panic!("fuzz store: {e}")))
    });
    let mut conn = store.lock();
    let at = NEXT.fetch_add(1, Ordering::Relaxed);
    let code = format!("f{at}");
    let e =
        NewEntry { origin_url: "https://fuzz.example/".into(), title: Some(title.to_string()), ..NewEntry::default() };
    assert_eq!(insert_committed(&mut **conn, &code, &e, at), Ok(true));
    if let Err(e) = search_finds(&mut **conn, &code, &term, at) {
        panic!("{e}");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::Connector;

    /// A new SQLite store in a fresh directory of its own (`name` and the process id), which the
    /// test removes when done.
    fn empty_store(name: &str) -> (std::path::PathBuf, Box<dyn Conn>) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let conn = crate::store::sqlite::Sqlite::new(dir.join("t.db")).connect().unwrap_or_else(|e| panic!("{e}"));
        (dir, conn)
    }

    #[test]
    fn a_large_batch_of_visits_keeps_counts_exact_and_each_codes_newest_visits() {
        let (dir, mut conn) = empty_store("weir-short-url-flush");
        large_batch_check(&mut *conn);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A batch of 5,500 visits to one code, 30 to another and one each to 5,000 more (counter
    /// updates span many chunks): counts exact, each code's newest visits kept. Run on every
    /// backend (the PostgreSQL suite calls it too).
    pub(crate) fn large_batch_check(conn: &mut dyn Conn) {
        let singles = 5_000;
        assert_eq!(conn.exec("BEGIN"), Ok(()));
        for code in ["hot", "warm"].into_iter().map(String::from).chain((0..singles).map(|i| format!("c{i:05}"))) {
            let e = NewEntry { origin_url: format!("https://{code}.example/"), ..NewEntry::default() };
            assert_eq!(insert_full(conn, &code, &e, 1), Ok(true));
        }
        assert_eq!(conn.index_pending(), Ok(()));
        assert_eq!(conn.exec("COMMIT"), Ok(()));
        // Interleaved arrivals, many codes.
        let visit = |code: String, at: i64, class: UaClass| Visit {
            code,
            at,
            referer: None,
            class,
            country: None,
            ip_hash: at as u64,
        };
        let mut batch = Vec::new();
        for i in 0..(5_000 + 500) {
            batch.push(visit("hot".into(), 1_000 + i, if i % 10 == 0 { UaClass::Bot } else { UaClass::Browser }));
            if i < singles as i64 {
                batch.push(visit(format!("c{i:05}"), 1_000 + i, UaClass::Other));
            }
            if i < 30 {
                batch.push(visit("warm".into(), 1_000 + i, UaClass::Browser));
            }
        }
        let n = batch.len();
        let mut folded = VisitBatch::default();
        for v in batch {
            folded.add(v);
        }
        assert_eq!(folded.visits(), n as u64);
        assert_eq!(flush_visits(conn, &folded, DEFAULT_KEEP_RECENT), Ok(()));
        let one = |conn: &mut dyn Conn, sql: &str| conn.query(sql, &[]).ok().and_then(|r| r[0][0].int());
        // Only this check's codes (the suite's own are eight characters long).
        let mine = "(code IN ('hot', 'warm') OR code LIKE 'c_____')";
        assert_eq!(
            one(conn, &format!("SELECT CAST(sum(visits) AS BIGINT) FROM short_url_codes WHERE {mine}")),
            Some(n as i64)
        );
        assert_eq!(
            one(conn, &format!("SELECT CAST(sum(n) AS BIGINT) FROM short_url_visit_stats WHERE {mine}")),
            Some(n as i64)
        );
        let hot = get(conn, "hot").ok().flatten().unwrap_or_else(|| panic!("hot"));
        assert_eq!((hot.visits, hot.bot_visits), (5_000 + 500, 550));
        // The recent sample is each code's newest visits.
        let report = report(conn, "hot", 10, 1, 100, 20_000).unwrap_or_else(|e| panic!("{e}"));
        let ats: Vec<i64> = report.recent.iter().map(|r| r.at).collect();
        let last = 1_000 + 5_000 + 499;
        assert_eq!(ats, (last - RECENT_PER_CODE as i64 + 1..=last).rev().collect::<Vec<_>>());
        assert_eq!(
            one(conn, "SELECT count(*) FROM short_url_visits WHERE code = 'warm'"),
            Some(RECENT_PER_CODE as i64)
        );
    }

    /// A code's visit rows are bounded by `keep`: each time its count passes a multiple of
    /// `keep`, the rows older than its newest `keep` go. Counts and the per-day series stay
    /// exact; a code with fewer visits than `keep` keeps them all. Run on every backend.
    pub(crate) fn keep_recent_check(conn: &mut dyn Conn) {
        let keep = 30;
        for code in ["kept", "calm"] {
            let e = NewEntry { origin_url: format!("https://{code}.example/"), ..NewEntry::default() };
            assert_eq!(insert_committed(conn, code, &e, 1), Ok(true));
        }
        let one = |conn: &mut dyn Conn, sql: &str| conn.query(sql, &[]).ok().and_then(|r| r[0][0].int());
        let rows = |conn: &mut dyn Conn, code: &str| {
            one(conn, &format!("SELECT count(*) FROM short_url_visits WHERE code = '{code}'")).unwrap_or(-1)
        };
        // Three flushes of 25 visits to `kept` (20 rows each), one visit to `calm` per flush.
        let mut at = 10_000;
        let mut after = Vec::new();
        for _ in 0..3 {
            let mut batch = VisitBatch::default();
            for _ in 0..25 {
                at += 1;
                batch.add(Visit {
                    code: "kept".into(),
                    at,
                    referer: None,
                    class: UaClass::Other,
                    country: None,
                    ip_hash: 1,
                });
            }
            batch.add(Visit {
                code: "calm".into(),
                at,
                referer: None,
                class: UaClass::Other,
                country: None,
                ip_hash: 1,
            });
            assert_eq!(flush_visits(conn, &batch, keep), Ok(()));
            after.push(rows(conn, "kept"));
        }
        // 25 visits: 20 rows. 50 (past 30): 40 rows, pruned to 30. 75 (past 60): 50, pruned to 30.
        assert_eq!(after, vec![20, 30, 30]);
        let kept = get(conn, "kept").ok().flatten().unwrap_or_else(|| panic!("kept"));
        assert_eq!(kept.visits, 75);
        let report = report(conn, "kept", 10, 1, 100, 20_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.days.iter().map(|d| d.1).sum::<i64>(), 75, "the series stays exact");
        // The newest 30: the last flush's 20 and the 10 newest of the one before.
        let ats: Vec<i64> = report.recent.iter().map(|r| r.at).collect();
        let kept_rows: Vec<i64> = (10_056..=10_075).rev().chain((10_041..=10_050).rev()).collect();
        assert_eq!(ats, kept_rows);
        assert_eq!(rows(conn, "calm"), 3, "a code below the bound keeps every row");
    }

    #[test]
    fn a_search_for_text_in_fts5_syntax_or_any_script_finds_its_link() {
        let (dir, mut conn) = empty_store("weir-short-url-hostile");
        let titles = [
            ("say \"hi\" now", "\"hi\""),
            ("\"\"\"\"", "\"\"\""),
            ("a*b*c NEAR(x y)", "NEAR("),
            ("col:umn ^start (grp) -neg +pos", "col:umn ^st"),
            ("x OR y AND z NOT w", "OR y AND"),
            ("100% of a_b", "0% of a_"),
            ("back\\slash", "k\\s"),
            ("İstanbul ĞÜŞ", "STANBUL"),
            ("日本語のタイトル", "本語の"),
            ("emoji 🚀🚀🚀 launch", "🚀🚀🚀"),
            (
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
            ),
        ];
        for (i, (title, term)) in titles.iter().enumerate() {
            let at = 10_000 + i as i64;
            let code = format!("h{i}");
            let e = NewEntry {
                origin_url: "https://x.example/".into(),
                title: Some((*title).into()),
                ..NewEntry::default()
            };
            assert_eq!(insert_committed(&mut *conn, &code, &e, at), Ok(true));
            assert_eq!(search_finds(&mut *conn, &code, term, at), Ok(()), "{title}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_search_finds_the_same_page_whichever_way_it_goes() {
        let (dir, mut conn) = empty_store("weir-short-url-ways");
        for i in 0..600 {
            let url = if i % 3 == 0 { format!("https://hit.example/{i}") } else { format!("https://miss.example/{i}") };
            let e = NewEntry { origin_url: url, ..NewEntry::default() };
            let ok = insert_committed(&mut *conn, &format!("code{i:04}"), &e, 1_000 + i / 7);
            assert_eq!(ok, Ok(true));
        }
        let long = u32::MAX;
        for order in [Order::CreatedDesc, Order::CreatedAsc, Order::VisitsDesc] {
            for page in [1, 3, 11] {
                let q = ListQuery {
                    page,
                    page_size: 20,
                    search: Some("HIT.example/".into()),
                    order,
                    ..ListQuery::default()
                };
                let rare = list_within(&mut *conn, &q, &Scope::All, PROBE, 0, 0).unwrap_or_else(|e| panic!("{e}"));
                let index = list_within(&mut *conn, &q, &Scope::All, 0, long, long).unwrap_or_else(|e| panic!("{e}"));
                let walk = list_within(&mut *conn, &q, &Scope::All, 0, 0, long).unwrap_or_else(|e| panic!("{e}"));
                let last = list_within(&mut *conn, &q, &Scope::All, 0, 0, 0).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!((rare.2, index.2, walk.2, last.2), (Way::Rare, Way::Index, Way::Walk, Way::IndexAfterWalk));
                let codes = |r: &(Vec<Link>, bool, Way)| r.0.iter().map(|l| l.code.clone()).collect::<Vec<_>>();
                assert_eq!(codes(&index), codes(&rare), "{order:?} page {page}");
                assert_eq!(codes(&index), codes(&walk), "{order:?} page {page}");
                assert_eq!(codes(&index), codes(&last), "{order:?} page {page}");
                assert_eq!(index.1, walk.1);
                assert_eq!(codes(&index).len(), if page == 11 { 0 } else { 20 }, "200 hits");
                assert!(index.0.iter().all(|l| l.origin_url.starts_with("https://hit.example/")));
            }
        }
        // Every trigram of "example/" is in all 600 links: no rare one, the budgets decide.
        let common = ListQuery { search: Some("example/".into()), ..ListQuery::default() };
        let found = list_within(&mut *conn, &common, &Scope::All, 100, u32::MAX, u32::MAX);
        assert_eq!(found.map(|r| (r.0.len(), r.2)), Ok((20, Way::Index)));
        // A trigram in no link: nothing, found at once.
        let none = ListQuery { search: Some("hit.nowhere".into()), ..ListQuery::default() };
        let found = list_within(&mut *conn, &none, &Scope::All, PROBE, 0, 0);
        assert_eq!(found.map(|r| (r.0.len(), r.2)), Ok((0, Way::Rare)));
        // A term outside ASCII is probed as typed (FTS5 folds it as its index did).
        let e = NewEntry {
            origin_url: "https://x.example/".into(),
            title: Some("Gezi İstanbul".into()),
            ..NewEntry::default()
        };
        assert_eq!(insert_committed(&mut *conn, "turkey", &e, 5_000), Ok(true));
        let q = ListQuery { search: Some("İstanbul".into()), ..ListQuery::default() };
        let found = list_within(&mut *conn, &q, &Scope::All, PROBE, 0, 0);
        assert_eq!(
            found.map(|r| (r.0.iter().map(|l| l.code.clone()).collect::<Vec<_>>(), r.2)),
            Ok((vec!["turkey".to_owned()], Way::Rare))
        );
        let short = ListQuery { search: Some("hi".into()), ..ListQuery::default() };
        let plain = list_within(&mut *conn, &short, &Scope::All, PROBE, 0, 0);
        assert_eq!(plain.map(|r| r.2), Ok(Way::Plain), "a 2-character term has no index to use");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
