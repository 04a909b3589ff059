//! The management API (`action: manage`), in the creation envelope:
//! - `GET /short/v1/urls` — a page of links (search, tag, dates, order);
//! - `GET /short/v1/urls/{code}` — one link with its options and visit counts;
//! - `PATCH /short/v1/urls/{code}` — change origin_url, validity, max_visits, tags, title;
//! - `DELETE /short/v1/urls/{code}` — the code answers 410 afterwards and is never reused;
//! - `GET /short/v1/urls/{code}/visits` — per-day series, referers, classes, recent visits.
//!
//! With a consumer on the request (an authentication plugin on the route), only its own links
//! exist for it (others answer 404); `admin_consumers` see everything.

use std::sync::Arc;

use serde::Serialize;
use weir_plugin::http::{Method, StatusCode};
use weir_plugin::{Flow, RequestCtx};

use crate::envelope::{data, method_not_allowed, request_error};
use crate::store::links::{self, Link, Scope};
use crate::{now, validate, Meta, Shared};

/// A date as RFC 3339 in UTC (`2030-01-31T12:00:00Z`).
pub fn rfc3339(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Visit counts of a link.
#[derive(Serialize, schemars::JsonSchema)]
pub struct VisitCounts {
    /// All visits, bots included.
    pub total: i64,
    /// Of which by bots.
    pub bots: i64,
    /// Redirects counted against `max_visits`.
    pub counted_for_max: i64,
}

/// A link as the API shows it.
#[derive(Serialize, schemars::JsonSchema)]
pub struct LinkView {
    /// The code.
    pub short_code: String,
    /// `{base}/{code}` on the link's domain.
    pub short_url: String,
    /// Where it redirects.
    pub origin_url: String,
    /// Title.
    pub title: Option<String>,
    /// Tags, sorted.
    pub tags: Vec<String>,
    /// Host of the short base it is shown on (null: `short_base`).
    pub domain: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// RFC 3339, UTC: before it the code answers 404.
    pub valid_since: Option<String>,
    /// RFC 3339, UTC: from it the code answers 410.
    pub valid_until: Option<String>,
    /// Redirects allowed (null: unlimited).
    pub max_visits: Option<i64>,
    /// Visit counts.
    pub visits: VisitCounts,
    /// The consumer that owns it (null: nobody).
    pub owner: Option<String>,
}

impl LinkView {
    fn of(meta: &Meta, l: &Link) -> LinkView {
        LinkView {
            short_code: l.code.clone(),
            short_url: format!("{}/{}", meta.base_of(l.domain.as_deref()), l.code),
            origin_url: l.origin_url.clone(),
            title: l.title.clone(),
            tags: l.tags.clone(),
            domain: l.domain.clone(),
            created_at: rfc3339(l.created_at),
            valid_since: l.valid_since.map(rfc3339),
            valid_until: l.expires_at.map(rfc3339),
            max_visits: l.max_visits,
            visits: VisitCounts { total: l.visits, bots: l.bot_visits, counted_for_max: l.cap_used },
            owner: l.owner.clone(),
        }
    }
}

/// A page of links.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Page {
    /// The links.
    pub items: Vec<LinkView>,
    /// 1-based page number.
    pub page: u32,
    /// Links per page.
    pub page_size: u32,
    /// Whether another page follows.
    pub has_more: bool,
}

/// One day of the visit series.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Day {
    /// `YYYY-MM-DD` (UTC).
    pub date: String,
    /// Visits, bots included.
    pub visits: i64,
    /// Of which by bots.
    pub bots: i64,
}

/// Visits from one referer host.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Referer {
    /// Host of the `Referer` (null: none sent, as in `recent`).
    pub referer: Option<String>,
    /// Visits.
    pub visits: i64,
}

/// One visit.
#[derive(Serialize, schemars::JsonSchema)]
pub struct VisitView {
    /// RFC 3339, UTC.
    pub at: String,
    /// Host of the `Referer`.
    pub referer: Option<String>,
    /// `browser`, `bot` or `other`.
    pub ua_class: String,
    /// ISO country code (only with a GeoIP database).
    pub country: Option<String>,
    /// Hash of the client IP with the salt of its day.
    pub ip_hash: String,
}

/// Counts by user-agent class.
#[derive(Serialize, schemars::JsonSchema, Default)]
pub struct Classes {
    /// Browsers.
    pub browser: i64,
    /// Bots.
    pub bot: i64,
    /// Others.
    pub other: i64,
}

/// `GET /short/v1/urls/{code}/visits`.
#[derive(Serialize, schemars::JsonSchema)]
pub struct VisitsView {
    /// The code.
    pub short_code: String,
    /// Visit counts (as on the link).
    pub visits: VisitCounts,
    /// The last `days` days with visits, oldest first.
    pub by_day: Vec<Day>,
    /// Visits by referer host, most first (50 at most).
    pub by_referer: Vec<Referer>,
    /// Visits by user-agent class.
    pub by_class: Classes,
    /// Page `page` of the visits, newest first.
    pub recent: Vec<VisitView>,
    /// 1-based page number of `recent`.
    pub page: u32,
    /// Visits per page.
    pub page_size: u32,
}

enum Target {
    List,
    One(String),
    Visits(String),
}

fn target(path: &str) -> Option<Target> {
    let mut segs = path.trim_end_matches('/').split('/').skip_while(|s| *s != "urls").skip(1);
    match (segs.next(), segs.next(), segs.next()) {
        (None, _, _) => Some(Target::List),
        (Some(c), None, _) => Some(Target::One(c.to_owned())),
        (Some(c), Some("visits"), None) => Some(Target::Visits(c.to_owned())),
        _ => None,
    }
}

fn not_found(code: &str, now: i64) -> Flow<'static> {
    request_error(StatusCode::NOT_FOUND, &format!("short code `{code}` not found"), now)
}

fn unavailable(e: &crate::StoreError, now: i64) -> Flow<'static> {
    log::debug!("short-url: {e}");
    request_error(StatusCode::SERVICE_UNAVAILABLE, e.public(), now)
}

/// Serves one management request.
pub(crate) fn handle(meta: &Arc<Meta>, shared: &Arc<Shared>, ctx: &mut RequestCtx) -> Flow<'static> {
    let now = now();
    let Some(target) = target(&ctx.path) else {
        return request_error(StatusCode::NOT_FOUND, "no such short-url endpoint", now);
    };
    if let Target::One(c) | Target::Visits(c) = &target {
        if !validate::is_code(c) {
            return not_found(c, now);
        }
    }
    let Some(store) = shared.store() else {
        return request_error(StatusCode::SERVICE_UNAVAILABLE, "storage is not configured", now);
    };
    let scope = meta.scope(ctx);
    let meta = meta.clone();
    // HEAD is GET without the body (the server leaves it out), as RFC 9110 has it.
    let method = if ctx.method == Method::HEAD { Method::GET } else { ctx.method.clone() };
    match (target, method) {
        (Target::List, Method::GET) => {
            let q = match validate::list_query(&ctx.query) {
                Ok(q) => q,
                Err(m) => return request_error(StatusCode::BAD_REQUEST, &m, now),
            };
            Flow::wait(async move {
                let q2 = q.clone();
                match store.run(move |c| links::list(c, &q2, &scope)).await {
                    Ok((items, has_more)) => Flow::Respond(data(
                        &Page {
                            items: items.iter().map(|l| LinkView::of(&meta, l)).collect(),
                            page: q.page,
                            page_size: q.page_size,
                            has_more,
                        },
                        now,
                    )),
                    Err(e) => unavailable(&e, now),
                }
            })
        }
        (Target::One(code), Method::GET) => Flow::wait(async move {
            match visible(&store, &code, &scope, now).await {
                Ok(l) => Flow::Respond(data(&LinkView::of(&meta, &l), now)),
                Err(f) => f,
            }
        }),
        (Target::Visits(code), Method::GET) => {
            let (mut page, mut page_size, mut days) = (1i64, 50i64, 30i64);
            for (k, v) in url::form_urlencoded::parse(ctx.query.as_bytes()) {
                // The same bounds as the list's `page` (1,000,000) where they share a name.
                let (slot, max): (&mut i64, i64) = match &*k {
                    "days" => (&mut days, 366),
                    "page" => (&mut page, 1_000_000),
                    "page_size" => (&mut page_size, 500),
                    // Ignored, as on the list: an authentication plugin's credential may be one.
                    _ => continue,
                };
                match v.parse::<i64>() {
                    Ok(n) if (1..=max).contains(&n) => *slot = n,
                    _ => {
                        return request_error(
                            StatusCode::BAD_REQUEST,
                            &format!("{k}: `{v}` must be a whole number from 1 to {max}"),
                            now,
                        )
                    }
                }
            }
            let (page, page_size) = (page as u32, page_size as u32);
            Flow::wait(async move {
                let link = match visible(&store, &code, &scope, now).await {
                    Ok(l) => l,
                    Err(f) => return f,
                };
                let c2 = code.clone();
                let report = match store.run(move |c| links::report(c, &c2, days, page, page_size, now)).await {
                    Ok(r) => r,
                    Err(e) => return unavailable(&e, now),
                };
                let mut by_class = Classes::default();
                for (class, n) in &report.classes {
                    match class.as_str() {
                        "browser" => by_class.browser = *n,
                        "bot" => by_class.bot = *n,
                        _ => by_class.other += *n,
                    }
                }
                Flow::Respond(data(
                    &VisitsView {
                        short_code: code,
                        visits: VisitCounts {
                            total: link.visits,
                            bots: link.bot_visits,
                            counted_for_max: link.cap_used,
                        },
                        by_day: report
                            .days
                            .iter()
                            .map(|(d, n, b)| Day { date: rfc3339(d * 86_400)[..10].to_owned(), visits: *n, bots: *b })
                            .collect(),
                        by_referer: report
                            .referers
                            .into_iter()
                            .map(|(referer, visits)| Referer {
                                referer: Some(referer).filter(|r| !r.is_empty()),
                                visits,
                            })
                            .collect(),
                        by_class,
                        recent: report
                            .recent
                            .into_iter()
                            .map(|v| VisitView {
                                at: rfc3339(v.at),
                                referer: v.referer,
                                ua_class: v.ua_class,
                                country: v.country,
                                ip_hash: v.ip_hash,
                            })
                            .collect(),
                        page,
                        page_size,
                    },
                    now,
                ))
            })
        }
        (Target::One(code), Method::PATCH) => {
            if let Some(refused) = crate::refuse_non_json(ctx, now) {
                return refused;
            }
            let body = ctx.body.take().unwrap_or_default();
            let patch = match validate::patch(&body, &meta.limits(), now) {
                Ok(p) => p,
                Err(m) => return request_error(StatusCode::BAD_REQUEST, &m, now),
            };
            let shared = shared.clone();
            Flow::wait(async move {
                let mut link = match visible(&store, &code, &scope, now).await {
                    Ok(l) => l,
                    Err(f) => return f,
                };
                if let Some(u) = patch.origin_url {
                    link.origin_url = u;
                }
                if let Some(t) = patch.expires_at {
                    link.expires_at = t;
                }
                if let Some(t) = patch.valid_since {
                    link.valid_since = t;
                }
                if let Some(m) = patch.max_visits {
                    link.max_visits = m;
                }
                if let Some(t) = patch.tags {
                    link.tags = t;
                }
                if let Some(t) = patch.title {
                    link.title = t;
                }
                if link.valid_since.zip(link.expires_at).is_some_and(|(a, b)| a >= b) {
                    return request_error(StatusCode::BAD_REQUEST, "valid_since: must be before valid_until", now);
                }
                let l2 = link.clone();
                let exclude_bots = meta.exclude_bots;
                match store.run(move |c| links::update(c, &l2, exclude_bots)).await {
                    Ok(Some(cap_used)) => {
                        shared.cache.remove(&code);
                        link.cap_used = cap_used;
                        Flow::Respond(data(&LinkView::of(&meta, &link), now))
                    }
                    Ok(None) => gone(&code, now),
                    Err(e) => unavailable(&e, now),
                }
            })
        }
        (Target::One(code), Method::DELETE) => {
            let shared = shared.clone();
            Flow::wait(async move {
                let link = match visible(&store, &code, &scope, now).await {
                    Ok(l) => l,
                    Err(f) => return f,
                };
                match store.run(move |c| links::delete(c, &link, now)).await {
                    Ok(true) => {
                        shared.cache.remove(&code);
                        Flow::Respond(data(&serde_json::json!({"short_code": code, "deleted_at": rfc3339(now)}), now))
                    }
                    Ok(false) => gone(&code, now),
                    Err(e) => unavailable(&e, now),
                }
            })
        }
        (Target::List, m) | (Target::Visits(_), m) => method_not_allowed(
            &format!("method {m} not allowed here (GET, HEAD; create with POST on the create route)"),
            "GET, HEAD",
            now,
        ),
        (Target::One(_), m) => method_not_allowed(
            &format!("method {m} not allowed (GET, HEAD, PATCH, DELETE)"),
            "GET, HEAD, PATCH, DELETE",
            now,
        ),
    }
}

fn gone(code: &str, now: i64) -> Flow<'static> {
    request_error(StatusCode::GONE, &format!("short code `{code}` has been deleted"), now)
}

/// The link of `code` if `scope` sees it: another owner's link is 404, a deleted one 410.
async fn visible(store: &Arc<crate::Store>, code: &str, scope: &Scope, now: i64) -> Result<Link, Flow<'static>> {
    let c = code.to_owned();
    match store.run(move |conn| links::get(conn, &c)).await {
        Ok(Some(l)) if scope.sees(&l) => {
            if l.deleted_at.is_some() {
                Err(gone(code, now))
            } else {
                Ok(l)
            }
        }
        Ok(_) => Err(not_found(code, now)),
        Err(e) => Err(unavailable(&e, now)),
    }
}
