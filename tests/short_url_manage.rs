//! short-url as a product (issue 28), through the real binary, on SQLite and on PostgreSQL:
//! creation options, the management API, owners, visits, max_visits (exact across two
//! instances on one PostgreSQL), QR codes, and kill -9 during batched visit writes.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Routes: open create/manage (no auth), authenticated create/manage under /a/, the same
/// requiring a consumer with no authentication plugin under /o/, redirects.
fn resources(p: &Prefix, meta: &str) -> String {
    format!(
        r#"consumers:
  - {{username: alice, plugins: {{key-auth: {{key: alice-key}}}}}}
  - {{username: bob, plugins: {{key-auth: {{key: bob-key}}}}}}
  - {{username: boss, plugins: {{key-auth: {{key: boss-key}}}}}}
routes:
  - {{id: c, uri: /short/v1/urls, methods: [POST], priority: 1, plugins: {{short-url: {{}}}}}}
  - {{id: m, uris: [/short/v1/urls, /short/v1/urls/*], plugins: {{short-url: {{action: manage}}}}}}
  - {{id: ac, uri: /a/short/v1/urls, methods: [POST], plugins: {{key-auth: {{}}, short-url: {{require_consumer: true}}}}}}
  - {{id: am, uris: [/a/short/v1/urls, /a/short/v1/urls/*], methods: [GET, PATCH, DELETE], plugins: {{key-auth: {{}}, short-url: {{action: manage, require_consumer: true}}}}}}
  - {{id: oc, uri: /o/short/v1/urls, methods: [POST], plugins: {{short-url: {{require_consumer: true}}}}}}
  - {{id: om, uris: [/o/short/v1/urls, /o/short/v1/urls/*], plugins: {{short-url: {{action: manage, require_consumer: true}}}}}}
  - {{id: r, uri: /s/*, methods: [GET, HEAD], plugins: {{short-url: {{action: resolve}}}}}}
plugin_metadata:
  - {{id: short-url, short_base: "http://{node}/s", short_bases: ["https://go.example/s"], admin_consumers: [boss]{meta}}}
"#,
        node = p.node()
    )
}

/// A gateway on SQLite (`pg` none) or on the PostgreSQL database `pg`.
fn gateway(pg: Option<&str>, meta: &str, visits: &str) -> (Prefix, Weir) {
    let storage = match pg {
        Some(url) => format!("storage: {{backend: postgres, url: \"{url}\"}}"),
        None => "storage: {backend: sqlite}".to_owned(),
    };
    let attr = format!("plugin_attr:\n  short-url:\n    {storage}\n    visits: {{flush_interval: 0.2{visits}}}\n");
    let p = Prefix::new("", &attr, "");
    p.write_resources(&resources(&p, meta));
    let w = Weir::spawn(&p);
    w.wait_ready(p.control());
    w.wait_ready(p.node());
    (p, w)
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

fn create_as(p: &Prefix, key: Option<&str>, body: &Value) -> Response {
    match key {
        None => request(p.node(), "POST", "/short/v1/urls", &[JSON], body.to_string().as_bytes()),
        Some(k) => request(p.node(), "POST", "/a/short/v1/urls", &[JSON, ("apikey", k)], body.to_string().as_bytes()),
    }
}

fn call(p: &Prefix, key: Option<&str>, method: &str, path: &str, body: Option<&Value>) -> Response {
    let body = body.map(Value::to_string).unwrap_or_default();
    match key {
        None => request(p.node(), method, &format!("/short/v1/urls{path}"), &[JSON], body.as_bytes()),
        Some(k) => {
            request(p.node(), method, &format!("/a/short/v1/urls{path}"), &[JSON, ("apikey", k)], body.as_bytes())
        }
    }
}

fn code_of(item: &Value) -> String {
    item["data"]["short_code"].as_str().unwrap_or_default().to_owned()
}

fn codes(list: &Value) -> Vec<String> {
    list["data"]["items"]
        .as_array()
        .map(|a| a.iter().map(|l| l["short_code"].as_str().unwrap_or_default().to_owned()).collect())
        .unwrap_or_default()
}

fn browser(p: &Prefix, code: &str, referer: &str) -> Response {
    request(
        p.node(),
        "GET",
        &format!("/s/{code}"),
        &[("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0"), ("Referer", referer)],
        b"",
    )
}

fn bot(p: &Prefix, code: &str) -> Response {
    request(
        p.node(),
        "GET",
        &format!("/s/{code}"),
        &[("User-Agent", "Googlebot/2.1 (+http://www.google.com/bot.html)")],
        b"",
    )
}

/// Creation options and the whole management API on one backend.
fn options_and_management(pg: Option<&str>) {
    let (p, _w) = gateway(pg, "", "");
    // Every option at once, a taken custom code (409 inside 207), find_if_exists.
    let first = create_as(
        &p,
        None,
        &json!([{"origin_url": "https://docs.example/guide", "custom_code": "guide-2030", "title": "The Guide", "find_if_exists": true,
                 "tags": ["docs", "Launch", "docs"], "domain": "go.example", "max_visits": 100,
                 "valid_until": "2099-01-01T00:00:00Z"}]),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let item = &first.json()["data"][0];
    assert_eq!(item["data"]["short_url"], "https://go.example/s/guide-2030", "{item}");
    let r = create_as(
        &p,
        None,
        &json!([{"origin_url": "https://other.example/", "custom_code": "guide-2030"},
                {"origin_url": "https://docs.example/guide", "find_if_exists": true, "title": "The Guide",
                 "tags": ["Launch", "docs"], "domain": "go.example", "max_visits": 100},
                {"origin_url": "https://plain.example/", "find_if_exists": true},
                {"origin_url": "https://x.example/", "custom_code": "no spaces"},
                {"origin_url": "https://x.example/", "domain": "evil.example"},
                {"origin_url": "https://x.example/", "valid_since": "yesterday"},
                {"origin_url": "https://x.example/", "max_visits": 0}]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let env = r.json();
    assert_eq!((env["code"].as_u64(), env["message"].as_str()), (Some(207), Some("partial success")), "{env}");
    let items = env["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(items[0]["code"], 409, "{}", items[0]);
    assert_eq!(items[0]["message"], "custom_code: is already taken");
    assert_eq!(items[0]["data"]["origin_url"], "https://other.example/");
    assert_eq!(items[1]["code"], 200);
    // Same URL, owner and options (validity is not compared): the existing link.
    assert_eq!(code_of(&items[1]), "guide-2030");
    assert_eq!(items[2]["code"], 200);
    let plain = code_of(&items[2]);
    for (i, field) in [(3, "custom_code: "), (4, "domain: "), (5, "valid_since: "), (6, "max_visits: ")] {
        assert_eq!(items[i]["code"], 400, "{}", items[i]);
        assert!(items[i]["message"].as_str().unwrap_or_default().starts_with(field), "{}", items[i]);
    }
    // The same URL and options again: the existing code.
    let again = create_as(&p, None, &json!([{"origin_url": "https://plain.example/", "find_if_exists": true}])).json();
    assert_eq!(code_of(&again["data"][0]), plain);
    // find_if_exists with a custom code matches that code only: never another code than asked.
    for _ in 0..2 {
        let own = json!([{"origin_url": "https://plain.example/", "find_if_exists": true, "custom_code": "plain-own"}]);
        let r = create_as(&p, None, &own).json();
        assert_eq!(code_of(&r["data"][0]), "plain-own", "{r}");
    }
    // An empty title is no title, the default base's domain no domain (as Shlink has them): the
    // same request written either way finds the one link.
    let node = p.node().to_string();
    let plainly = json!([{"origin_url": "https://same.example/", "custom_code": "same-one", "find_if_exists": true}]);
    assert_eq!(create_as(&p, None, &plainly).status, 200);
    for spelled in [json!({"title": ""}), json!({"domain": node}), json!({"title": "", "domain": node.to_uppercase()})]
    {
        let mut body = plainly.clone();
        if let (Some(entry), Some(extra)) = (body[0].as_object_mut(), spelled.as_object()) {
            entry.extend(extra.clone());
        }
        let r = create_as(&p, None, &body);
        assert_eq!((r.status, code_of(&r.json()["data"][0])), (200, "same-one".to_owned()), "{spelled}: {}", r.text());
    }
    let same = call(&p, None, "GET", "/same-one", None).json();
    assert_eq!((&same["data"]["title"], &same["data"]["domain"]), (&Value::Null, &Value::Null), "{same}");
    assert_eq!(call(&p, None, "DELETE", "/same-one", None).status, 200, "out of the counts below");
    // A link past its max_visits answers 410: find_if_exists does not hand it out again.
    let capped = json!([{"origin_url": "https://capped.example/", "find_if_exists": true, "max_visits": 1}]);
    let first_capped = code_of(&create_as(&p, None, &capped).json()["data"][0]);
    assert_eq!(get(p.node(), &format!("/s/{first_capped}")).status, 302);
    assert_eq!(get(p.node(), &format!("/s/{first_capped}")).status, 410);
    let next_capped = code_of(&create_as(&p, None, &capped).json()["data"][0]);
    assert_ne!(next_capped, first_capped, "an exhausted link was handed out by find_if_exists");
    assert_eq!(get(p.node(), &format!("/s/{next_capped}")).status, 302);
    // A lone taken custom code: envelope 409.
    let r = create_as(&p, None, &json!([{"origin_url": "https://y.example/", "custom_code": "guide-2030"}]));
    assert_eq!((r.status, r.json()["code"].as_u64()), (409, Some(409)), "{}", r.text());
    // A taken code beside an invalid entry: the invalid one is the client's to fix, 400.
    let r = create_as(
        &p,
        None,
        &json!([{"origin_url": "https://y.example/", "custom_code": "guide-2030"}, {"origin_url": "ftp://bad"}]),
    );
    assert_eq!((r.status, r.json()["code"].as_u64()), (400, Some(400)), "{}", r.text());

    // GET one.
    let one = call(&p, None, "GET", "/guide-2030", None);
    assert_eq!(one.status, 200, "{}", one.text());
    let l = &one.json()["data"];
    assert_eq!(l["origin_url"], "https://docs.example/guide");
    assert_eq!(l["tags"], json!(["Launch", "docs"]));
    assert_eq!(l["title"], "The Guide");
    assert_eq!(l["domain"], "go.example");
    assert_eq!(l["max_visits"], 100);
    assert_eq!(l["valid_until"], "2099-01-01T00:00:00Z");
    assert!(l["created_at"].as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 20), "{l}");
    assert_eq!(l["visits"]["total"], 0);
    assert_eq!(call(&p, None, "GET", "/Nope1234", None).status, 404);

    // List: paging, search (URL, title, tags), tag filter, order, dates.
    let many: Vec<Value> = (0..25)
        .map(|i| json!({"origin_url": format!("https://list.example/{i}"), "tags": [if i % 2 == 0 {"even"} else {"odd"}]}))
        .collect();
    assert_eq!(create_as(&p, None, &json!(many)).status, 200);
    let page1 = call(&p, None, "GET", "?page_size=10", None).json();
    assert_eq!(codes(&page1).len(), 10);
    assert_eq!(page1["data"]["has_more"], true);
    let all: Vec<String> = (1..=4)
        .flat_map(|pg| codes(&call(&p, None, "GET", &format!("?page_size=10&page={pg}"), None).json()))
        .collect();
    let mut dedup = all.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!((all.len(), dedup.len()), (30, 30), "every link once over the pages");
    assert_eq!(codes(&call(&p, None, "GET", "?search=LIST.example%2F1", None).json()).len(), 11, "1, 10..19");
    assert_eq!(codes(&call(&p, None, "GET", "?search=the%20guide", None).json()), vec!["guide-2030"], "by title");
    assert_eq!(codes(&call(&p, None, "GET", "?search=launch", None).json()), vec!["guide-2030"], "by tag");
    assert_eq!(codes(&call(&p, None, "GET", "?search=100%25", None).json()).len(), 0, "% is literal");
    assert_eq!(codes(&call(&p, None, "GET", "?tag=even&page_size=100", None).json()).len(), 13);
    assert_eq!(codes(&call(&p, None, "GET", "?since=2099-01-01T00:00:00Z", None).json()).len(), 0);
    assert_eq!(codes(&call(&p, None, "GET", "?until=2000-01-01T00:00:00Z", None).json()).len(), 0);
    assert_eq!(codes(&call(&p, None, "GET", "?since=2000-01-01T00:00:00Z&page_size=100", None).json()).len(), 30);
    for bad in ["?page=0", "?page_size=101", "?order_by=name", "?since=now", "?search=%FF", "?tag=%C3%28"] {
        let r = call(&p, None, "GET", bad, None);
        assert_eq!((r.status, r.json()["code"].as_u64()), (400, Some(400)), "{bad}: {}", r.text());
    }
    // A method the target does not take: 405 with the methods it does (RFC 9110's `Allow`).
    let r = call(&p, None, "PATCH", "", Some(&json!({})));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")), "{}", r.text());
    let r = call(&p, None, "DELETE", &format!("/{plain}/visits"), None);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")), "{}", r.text());
    // The route takes every method, as the shipped one does: the plugin answers 405 in its
    // envelope (not the router's 404), and HEAD is GET without the body.
    let r = call(&p, None, "PUT", &format!("/{plain}"), Some(&json!({})));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD, PATCH, DELETE")), "{}", r.text());
    assert_eq!(r.json()["code"].as_u64(), Some(405), "{}", r.text());
    let r = call(&p, None, "HEAD", &format!("/{plain}"), None);
    assert_eq!((r.status, r.body.len()), (200, 0), "{}", r.text());
    assert!(r.header("content-length").is_some_and(|n| n != "0"), "HEAD tells GET's length");
    // Order by visits: the most visited link first (the capped links above have one each).
    for _ in 0..2 {
        assert_eq!(browser(&p, &plain, "https://news.example/").status, 302);
    }
    assert!(eventually(Duration::from_secs(5), || {
        codes(&call(&p, None, "GET", "?order_by=-visits&page_size=1", None).json()) == vec![plain.clone()]
    }));

    // PATCH: fields change, validation, unknown fields refused, redirect follows.
    let r = call(
        &p,
        None,
        "PATCH",
        &format!("/{plain}"),
        Some(&json!({"origin_url": "https://plain.example/v2", "title": "v2", "tags": ["x"], "max_visits": 50})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"]["origin_url"], "https://plain.example/v2");
    assert_eq!(get(p.node(), &format!("/s/{plain}")).header("location"), Some("https://plain.example/v2"));
    // The search index follows the change (SQLite: FTS5 kept by triggers; PostgreSQL: pg_trgm).
    assert_eq!(codes(&call(&p, None, "GET", "?search=plain.example%2Fv2", None).json()), vec![plain.clone()]);
    assert_eq!(codes(&call(&p, None, "GET", "?search=v2", None).json()), vec![plain.clone()], "short term: scan");
    // A JSON merge patch (RFC 7396) is what a PATCH here is; other media types are a 415.
    let path = format!("/short/v1/urls/{plain}");
    let merge = ("Content-Type", "application/merge-patch+json");
    let r = request(p.node(), "PATCH", &path, &[merge], br#"{"title": "merged"}"#);
    assert_eq!((r.status, r.json()["data"]["title"].as_str()), (200, Some("merged")), "{}", r.text());
    let r = request(p.node(), "PATCH", &path, &[("Content-Type", "text/plain")], br#"{"title": "v2"}"#);
    assert_eq!((r.status, r.json()["code"].as_u64()), (415, Some(415)), "{}", r.text());
    let r = request(p.node(), "POST", "/short/v1/urls", &[merge], br#"[{"origin_url": "https://m.example/"}]"#);
    assert_eq!(r.status, 415, "creation takes application/json only: {}", r.text());
    assert_eq!(call(&p, None, "PATCH", &format!("/{plain}"), Some(&json!({"title": "v2"}))).status, 200);
    for (body, field) in [
        (json!({"origin_url": "ftp://x"}), "origin_url: "),
        (json!({"valid_until": "tomorrow"}), "valid_until: "),
        // In the past: the sweep would delete the link within a minute and free its code.
        (json!({"valid_until": "2020-01-01T00:00:00Z"}), "valid_until: must be in the future"),
        (json!({"shortCode": "x"}), "shortCode: "),
        (json!({"max_visits": -1}), "max_visits: "),
    ] {
        let r = call(&p, None, "PATCH", &format!("/{plain}"), Some(&body));
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.json()["message"].as_str().unwrap_or_default().starts_with(field), "{}", r.text());
    }
    // Not yet valid: 404; valid again when cleared.
    let r = call(&p, None, "PATCH", &format!("/{plain}"), Some(&json!({"valid_since": "2098-01-01T00:00:00Z"})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(p.node(), &format!("/s/{plain}")).status, 404);
    call(&p, None, "PATCH", &format!("/{plain}"), Some(&json!({"valid_since": null})));
    assert_eq!(get(p.node(), &format!("/s/{plain}")).status, 302);

    // DELETE: 410 afterwards, and the code is never handed out again.
    let r = call(&p, None, "DELETE", "/guide-2030", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"]["short_code"], "guide-2030");
    assert_eq!(get(p.node(), "/s/guide-2030").status, 410);
    assert_eq!(call(&p, None, "GET", "/guide-2030", None).status, 410);
    assert_eq!(call(&p, None, "DELETE", "/guide-2030", None).status, 410);
    let r = create_as(&p, None, &json!([{"origin_url": "https://z.example/", "custom_code": "guide-2030"}]));
    assert_eq!(r.status, 409, "a deleted code is never reused: {}", r.text());
    assert!(!codes(&call(&p, None, "GET", "?page_size=100", None).json()).contains(&"guide-2030".to_owned()));
}

#[test]
fn options_and_management_on_sqlite() {
    options_and_management(None);
}

#[test]
fn options_and_management_on_postgres() {
    let Some(db) = pg::PgDb::fresh("manage") else { return };
    options_and_management(Some(db.url()));
    // Searches of 3+ characters are served by the pg_trgm index the gateway created, on the
    // texts' own table (kept by triggers), not on the links' rows.
    let mut c = db.client();
    assert_eq!(pg::count(&mut c, "SELECT count(*) FROM pg_indexes WHERE indexname = 'short_url_search_trgm'"), 1);
    assert_eq!(
        pg::count(
            &mut c,
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'short_url_codes' AND indexdef LIKE '%USING gin%'"
        ),
        0,
        "no trigram index on the links' rows"
    );
    let texts = "SELECT count(*) FROM short_url_codes c JOIN short_url_search s USING (code)
                 WHERE s.origin_url = c.origin_url AND s.title IS NOT DISTINCT FROM c.title AND s.tags IS NOT DISTINCT FROM c.tags";
    let links = pg::count(&mut c, "SELECT count(*) FROM short_url_codes");
    assert!(links > 0);
    assert_eq!(pg::count(&mut c, "SELECT count(*) FROM short_url_search"), links, "a text row per link");
    assert_eq!(pg::count(&mut c, texts), links, "the texts as the links hold them, PATCHes included");
    // The expiry sweep's DELETE takes the texts with it.
    c.batch_execute("DELETE FROM short_url_codes WHERE code IN (SELECT code FROM short_url_codes LIMIT 1)")
        .expect("delete a link");
    assert_eq!(pg::count(&mut c, "SELECT count(*) FROM short_url_search"), links - 1);
    // An older version (a rolling upgrade) puts its index back on the links' rows; a gateway of
    // this version drops it when it connects.
    c.batch_execute("CREATE INDEX short_url_codes_search ON short_url_codes USING gin (origin_url gin_trgm_ops)")
        .expect("the old index");
    let (_p, w) = gateway(Some(db.url()), "", "");
    let old = "SELECT count(*) FROM pg_indexes WHERE indexname = 'short_url_codes_search'";
    assert!(eventually(Duration::from_secs(5), || pg::count(&mut c, old) == 0), "{}", w.log_text());
}

/// Owners: each consumer sees its own links only, others are 404; admins see and change all;
/// links of no owner are visible to admins only once authentication is on.
fn owners(a: &Prefix, b: &Prefix) {
    let r = create_as(a, Some("alice-key"), &json!([{"origin_url": "https://alice.example/"}]));
    assert_eq!(r.status, 200, "{}", r.text());
    let alice = code_of(&r.json()["data"][0]);
    let bob =
        code_of(&create_as(b, Some("bob-key"), &json!([{"origin_url": "https://bob.example/"}])).json()["data"][0]);
    let nobody = code_of(&create_as(a, None, &json!([{"origin_url": "https://nobody.example/"}])).json()["data"][0]);
    // Each through both instances.
    for p in [a, b] {
        assert_eq!(call(p, Some("alice-key"), "GET", &format!("/{alice}"), None).json()["data"]["owner"], "alice");
        for (key, code) in [("bob-key", &alice), ("alice-key", &bob), ("alice-key", &nobody), ("bob-key", &nobody)] {
            for (m, body) in [("GET", None), ("PATCH", Some(json!({"title": "mine"}))), ("DELETE", None)] {
                let r = call(p, Some(key), m, &format!("/{code}"), body.as_ref());
                assert_eq!(r.status, 404, "{key} {m} {code}: {}", r.text());
            }
            assert_eq!(call(p, Some(key), "GET", &format!("/{code}/visits"), None).status, 404);
        }
        assert_eq!(codes(&call(p, Some("alice-key"), "GET", "", None).json()), vec![alice.clone()]);
        assert_eq!(codes(&call(p, Some("bob-key"), "GET", "", None).json()), vec![bob.clone()]);
        let mut all = codes(&call(p, Some("boss-key"), "GET", "", None).json());
        all.sort();
        let mut want = vec![alice.clone(), bob.clone(), nobody.clone()];
        want.sort();
        assert_eq!(all, want, "admins see every link, also those of no owner");
        assert_eq!(call(p, Some("alice-key"), "GET", "", None).status, 200);
        assert_eq!(call(p, Some("nokey"), "GET", "", None).status, 401);
        // The key in the query, as key-auth also takes it: the API ignores that parameter.
        let by_query = request(p.node(), "GET", "/a/short/v1/urls?apikey=alice-key&page_size=5", &[], b"");
        assert_eq!(codes(&by_query.json()), vec![alice.clone()], "{}", by_query.text());
        let r = request(p.node(), "GET", &format!("/a/short/v1/urls/{alice}/visits?apikey=alice-key"), &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Searches, tag filters and orders stay within the owner's links, and so do
    // `find_if_exists` and `custom_code`: another owner's link is never returned or revealed.
    let shared = |p: &Prefix, key: &str, who: &str| {
        let entry = json!([{"origin_url": "https://shared.example/", "tags": ["shared"], "title": "shared page",
                            "find_if_exists": true}]);
        let r = create_as(p, Some(key), &entry);
        assert_eq!(r.json()["data"][0]["code"], 200, "{who}: {}", r.text());
        code_of(&r.json()["data"][0])
    };
    let alice_shared = shared(a, "alice-key", "alice");
    let bob_shared = shared(b, "bob-key", "bob");
    assert_ne!(alice_shared, bob_shared, "find_if_exists found another owner's link");
    assert_eq!(shared(b, "alice-key", "alice again"), alice_shared, "find_if_exists finds the owner's own");
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    for p in [a, b] {
        for q in ["?search=shared.example", "?search=shared%20page", "?tag=shared", "?tag=shared&order_by=-visits"] {
            assert_eq!(codes(&call(p, Some("alice-key"), "GET", q, None).json()), vec![alice_shared.clone()], "{q}");
            assert_eq!(codes(&call(p, Some("bob-key"), "GET", q, None).json()), vec![bob_shared.clone()], "{q}");
        }
        let mine = codes(&call(p, Some("alice-key"), "GET", "?search=example&order_by=created_at", None).json());
        assert_eq!(sorted(mine), sorted(vec![alice.clone(), alice_shared.clone()]));
        let all = codes(&call(p, Some("boss-key"), "GET", "?tag=shared", None).json());
        assert_eq!(sorted(all), sorted(vec![alice_shared.clone(), bob_shared.clone()]));
    }
    let custom = format!("own-{alice_shared}");
    let r = create_as(a, Some("alice-key"), &json!([{"origin_url": "https://custom.example/", "custom_code": custom}]));
    assert_eq!(r.json()["data"][0]["code"], 200, "{}", r.text());
    let r = create_as(
        b,
        Some("bob-key"),
        &json!([{"origin_url": "https://custom.example/", "custom_code": custom, "find_if_exists": true}]),
    );
    assert_eq!(r.json()["data"][0]["code"], 409, "another owner's custom code is taken, not returned: {}", r.text());
    assert_eq!(call(b, Some("bob-key"), "GET", &format!("/{custom}"), None).status, 404);
    // Admins change and delete any link; the owner sees the change.
    let r = call(b, Some("boss-key"), "PATCH", &format!("/{alice}"), Some(&json!({"title": "by boss"})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(call(a, Some("alice-key"), "GET", &format!("/{alice}"), None).json()["data"]["title"], "by boss");
    assert_eq!(call(a, Some("boss-key"), "DELETE", &format!("/{nobody}"), None).status, 200);
    assert_eq!(call(a, Some("alice-key"), "DELETE", &format!("/{alice}"), None).status, 200);
    assert!(eventually(Duration::from_secs(8), || get(b.node(), &format!("/s/{alice}")).status == 410));
}

/// `require_consumer` refuses what no authentication plugin identified, instead of serving it
/// as no owner (who sees every link); with a consumer it serves as usual (the /a/ routes above).
#[test]
fn a_route_requiring_a_consumer_refuses_a_request_without_one() {
    let (p, _w) = gateway(None, "", "");
    let code = code_of(&create_as(&p, None, &json!([{"origin_url": "https://open.example/"}])).json()["data"][0]);
    let r = request(p.node(), "POST", "/o/short/v1/urls", &[JSON], br#"[{"origin_url": "https://o.example/"}]"#);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["code"], 403);
    assert!(r.json()["message"].as_str().is_some_and(|m| m.contains("require_consumer")), "{}", r.text());
    for (m, path) in [
        ("GET", "/o/short/v1/urls".to_owned()),
        ("GET", format!("/o/short/v1/urls/{code}")),
        ("PATCH", format!("/o/short/v1/urls/{code}")),
        ("DELETE", format!("/o/short/v1/urls/{code}")),
    ] {
        let r = request(p.node(), m, &path, &[JSON], b"");
        assert_eq!(r.status, 403, "{m} {path}: {}", r.text());
    }
    assert_eq!(call(&p, None, "GET", &format!("/{code}"), None).status, 200, "not deleted");
    let listed = codes(&call(&p, None, "GET", "", None).json());
    assert_eq!(listed, vec![code], "nothing created through the refused route");
}

#[test]
fn owners_on_sqlite() {
    let (p, _w) = gateway(None, "", "");
    owners(&p, &p);
}

#[test]
fn owners_across_two_instances_on_one_postgres() {
    let Some(db) = pg::PgDb::fresh("owners") else { return };
    let (a, _wa) = gateway(Some(db.url()), "", "");
    let (b, _wb) = gateway(Some(db.url()), "", "");
    owners(&a, &b);
}

/// Visits are recorded off the redirect path and show within 5 s; QR fetches are not visits.
fn visits(pg: Option<&str>) {
    let (p, _w) = gateway(pg, "", "");
    let code = code_of(&create_as(&p, None, &json!([{"origin_url": "https://v.example/"}])).json()["data"][0]);
    for _ in 0..3 {
        assert_eq!(browser(&p, &code, "https://News.example/story?id=1").status, 302);
    }
    assert_eq!(browser(&p, &code, "https://blog.example/").status, 302);
    assert_eq!(bot(&p, &code).status, 302);
    assert_eq!(get(p.node(), &format!("/s/{code}")).status, 302, "no user-agent: other");
    assert_eq!(get(p.node(), &format!("/s/{code}/qr")).status, 200);
    let report = || call(&p, None, "GET", &format!("/{code}/visits"), None).json();
    assert!(
        eventually(Duration::from_secs(5), || report()["data"]["visits"]["total"] == 6),
        "a visit shows within 5 s: {}",
        report()
    );
    let r = report();
    let d = &r["data"];
    assert_eq!(d["visits"], json!({"total": 6, "bots": 1, "counted_for_max": 0}), "{r}");
    assert_eq!(d["by_class"], json!({"browser": 4, "bot": 1, "other": 1}));
    assert_eq!(d["by_referer"][0], json!({"referer": "news.example", "visits": 3}));
    // No referer sent: null, as in `recent`.
    assert_eq!(d["by_referer"][1], json!({"referer": null, "visits": 2}), "{r}");
    let days = d["by_day"].as_array().cloned().unwrap_or_default();
    assert_eq!(days.len(), 1);
    assert_eq!((days[0]["visits"].as_i64(), days[0]["bots"].as_i64()), (Some(6), Some(1)));
    assert_eq!(days[0]["date"].as_str().map(str::len), Some(10));
    let recent = d["recent"].as_array().cloned().unwrap_or_default();
    assert_eq!(recent.len(), 6);
    for v in &recent {
        let h = v["ip_hash"].as_str().unwrap_or_default();
        assert!(h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()), "{v}");
        assert!(!v.to_string().contains("127.0.0.1"), "never the client IP in clear: {v}");
    }
    assert_eq!(recent[0]["ip_hash"], recent[5]["ip_hash"], "one client, one salt period");
    assert_eq!(
        call(&p, None, "GET", &format!("/{code}/visits?page=2&page_size=4"), None).json()["data"]["recent"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(call(&p, None, "GET", &format!("/{code}/visits?days=0"), None).status, 400);
    assert_eq!(call(&p, None, "GET", &format!("/{code}"), None).json()["data"]["visits"]["total"], 6);
    let stats = get(p.control(), "/v1/plugin/short-url/stats");
    assert_eq!(stats.status, 200);
    let stats = stats.json();
    assert!(stats["visits_recorded"].as_u64().is_some_and(|n| n >= 6), "{stats}");
    assert_eq!(stats["visits_dropped"], 0, "{stats}");
}

#[test]
fn visits_on_sqlite() {
    visits(None);
}

#[test]
fn visits_on_postgres() {
    let Some(db) = pg::PgDb::fresh("visits") else { return };
    visits(Some(db.url()));
    // A visit's counter update leaves the search texts' rows alone: a row the counter update
    // had rewritten would carry the same transaction id as its link's row.
    let mut c = db.client();
    assert!(pg::count(&mut c, "SELECT count(*) FROM short_url_codes WHERE visits > 0") > 0);
    assert_eq!(
        pg::count(
            &mut c,
            "SELECT count(*) FROM short_url_codes c JOIN short_url_search s USING (code) WHERE c.visits > 0 AND s.xmin = c.xmin"
        ),
        0
    );
}

#[test]
fn max_visits_and_bots() {
    let (p, _w) = gateway(None, ", max_visits_exclude_bots: true", "");
    let code = code_of(
        &create_as(&p, None, &json!([{"origin_url": "https://cap.example/", "max_visits": 3}])).json()["data"][0],
    );
    for _ in 0..5 {
        assert_eq!(bot(&p, &code).status, 302, "bots do not count when excluded");
    }
    // A HEAD (link checkers, previewers) is a look, not a visit: not counted, not recorded.
    for _ in 0..5 {
        let r = request(p.node(), "HEAD", &format!("/s/{code}"), &[("User-Agent", "Mozilla/5.0")], b"");
        assert_eq!((r.status, r.header("location")), (302, Some("https://cap.example/")));
    }
    for i in 0..3 {
        assert_eq!(browser(&p, &code, "").status, 302, "visit {i}");
    }
    let r = browser(&p, &code, "");
    assert_eq!(r.status, 410, "past max_visits: {}", r.text());
    assert!(r.text().contains("max_visits"));
    assert_eq!(request(p.node(), "HEAD", &format!("/s/{code}"), &[], b"").status, 410, "a look obeys the cap");
    // Raising the cap lets it through again.
    let r = call(&p, None, "PATCH", &format!("/{code}"), Some(&json!({"max_visits": 4})));
    assert_eq!(r.status, 200);
    assert_eq!(browser(&p, &code, "").status, 302);
    assert_eq!(browser(&p, &code, "").status, 410);
    assert!(eventually(Duration::from_secs(5), || {
        let v = call(&p, None, "GET", &format!("/{code}"), None).json();
        v["data"]["visits"] == json!({"total": 9, "bots": 5, "counted_for_max": 4})
    }));
    // A cap set on a link that had none counts the visits it already had (its bots' excluded
    // here), as Shlink compares maxVisits with every visit: past it, 410 at once.
    let open = code_of(&create_as(&p, None, &json!([{"origin_url": "https://open.example/"}])).json()["data"][0]);
    // Redirects of `open` that must all pass, then until the store counts `total` visits.
    let visit_then_count = |bots: usize, browsers: usize, total: u64| {
        for _ in 0..bots {
            assert_eq!(bot(&p, &open).status, 302);
        }
        for _ in 0..browsers {
            assert_eq!(browser(&p, &open, "").status, 302);
        }
        assert!(eventually(Duration::from_secs(5), || {
            call(&p, None, "GET", &format!("/{open}"), None).json()["data"]["visits"]["total"] == total
        }));
    };
    visit_then_count(2, 3, 5);
    let r = call(&p, None, "PATCH", &format!("/{open}"), Some(&json!({"max_visits": 3})));
    assert_eq!(r.json()["data"]["visits"]["counted_for_max"], 3, "{}", r.text());
    assert_eq!(browser(&p, &open, "").status, 410, "3 visits already: the cap of 3 is reached");
    // Raised, the count goes on from there; removed and set again, it starts from every visit.
    let r = call(&p, None, "PATCH", &format!("/{open}"), Some(&json!({"max_visits": 4})));
    assert_eq!(r.json()["data"]["visits"]["counted_for_max"], 3, "{}", r.text());
    assert_eq!(browser(&p, &open, "").status, 302);
    assert_eq!(browser(&p, &open, "").status, 410);
    assert_eq!(call(&p, None, "PATCH", &format!("/{open}"), Some(&json!({"max_visits": null}))).status, 200);
    visit_then_count(0, 2, 8);
    let r = call(&p, None, "PATCH", &format!("/{open}"), Some(&json!({"max_visits": 10})));
    assert_eq!(r.json()["data"]["visits"]["counted_for_max"], 6, "8 visits, 2 of them bots': {}", r.text());
}

#[test]
fn max_visits_is_exact_across_two_instances_on_one_postgres() {
    let Some(db) = pg::PgDb::fresh("cap") else { return };
    let (a, _wa) = gateway(Some(db.url()), "", "");
    let (b, _wb) = gateway(Some(db.url()), "", "");
    let code = code_of(
        &create_as(&a, None, &json!([{"origin_url": "https://cap.example/", "max_visits": 25}])).json()["data"][0],
    );
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let node = if i % 2 == 0 { a.node() } else { b.node() };
            let code = code.clone();
            std::thread::spawn(move || {
                (0..15).map(|_| request(node, "GET", &format!("/s/{code}"), &[], b"").status).collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect();
    assert_eq!(statuses.len(), 120);
    assert_eq!(statuses.iter().filter(|s| **s == 302).count(), 25, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 410).count(), 95);
}

#[test]
fn qr_codes() {
    let (p, _w) = gateway(None, "", "");
    let code = code_of(
        &create_as(&p, None, &json!([{"origin_url": "https://qr.example/", "domain": "go.example"}])).json()["data"][0],
    );
    let r = get(p.node(), &format!("/s/{code}/qr?size=200&margin=2"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("image/png"));
    assert_eq!(r.header("cache-control"), Some("public, max-age=86400"));
    assert!(r.body.starts_with(b"\x89PNG\r\n\x1a\n"));
    // IHDR's width and height: the size asked for.
    let side = |b: &[u8], at: usize| b.get(at..at + 4).map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    assert_eq!((side(&r.body, 16), side(&r.body, 20)), (Some(200), Some(200)));
    let r = get(p.node(), &format!("/s/{code}/qr?format=svg"));
    assert_eq!((r.status, r.header("content-type")), (200, Some("image/svg+xml")));
    assert!(r.text().starts_with("<?xml") && r.text().contains("<svg"));
    // Unknown parameters are ignored (a cache buster here).
    assert_eq!(get(p.node(), &format!("/s/{code}/qr?format=svg&v=2")).status, 200);
    for bad in ["size=1", "format=gif", "margin=-1"] {
        let r = get(p.node(), &format!("/s/{code}/qr?{bad}"));
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.json()["message"].as_str().is_some(), "{}", r.text());
    }
    let r = get(p.node(), "/s/Missing9/qr");
    assert_eq!(r.status, 404);
    assert!(r.text().contains("`Missing9`"), "the answer names the code: {}", r.text());
    let r = get(p.node(), &format!("/s/{code}/"));
    assert_eq!(r.status, 404);
    assert!(r.text().contains(&format!("`{code}/` is not a short code")), "{}", r.text());
    // The rules of a redirect, without counting a visit: past max_visits, 410.
    let capped = code_of(
        &create_as(&p, None, &json!([{"origin_url": "https://qr-cap.example/", "max_visits": 1}])).json()["data"][0],
    );
    assert_eq!(get(p.node(), &format!("/s/{capped}/qr")).status, 200);
    assert_eq!(get(p.node(), &format!("/s/{capped}")).status, 302);
    assert_eq!(get(p.node(), &format!("/s/{capped}/qr")).status, 410);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        call(&p, None, "GET", &format!("/{code}"), None).json()["data"]["visits"]["total"],
        0,
        "a QR fetch is not a visit"
    );
}

/// kill -9 while visits are being written: links stay intact, and what was recorded is whole
/// batches (the link counters equal the visit rows); only the unflushed tail is lost.
#[test]
fn kill_9_during_visit_writes_loses_only_the_unflushed_batch() {
    let (p, mut w) = gateway(None, "", ", batch_size: 50");
    let body: Vec<Value> = (0..20).map(|i| json!({"origin_url": format!("https://k.example/{i}")})).collect();
    let created = create_as(&p, None, &json!(body)).json();
    let links: Vec<(String, String)> = created["data"]
        .as_array()
        .map(|a| {
            a.iter().map(|i| (code_of(i), i["data"]["origin_url"].as_str().unwrap_or_default().to_owned())).collect()
        })
        .unwrap_or_default();
    // Flushed for sure: 200 visits, then a wait of several flush intervals.
    for i in 0..200 {
        assert_eq!(get(p.node(), &format!("/s/{}", links[i % 20].0)).status, 302);
    }
    std::thread::sleep(Duration::from_secs(2));
    // Then visits from 4 clients, and kill -9 in the middle of them.
    let node = p.node();
    let codes: Vec<String> = links.iter().map(|l| l.0.clone()).collect();
    let load: Vec<_> = (0..4)
        .map(|t| {
            let codes = codes.clone();
            std::thread::spawn(move || {
                let mut ok = 0;
                for i in 0..100_000 {
                    let path = format!("/s/{}", codes[(i + t) % 20]);
                    match std::panic::catch_unwind(|| request(node, "GET", &path, &[], b"").status) {
                        Ok(302) => ok += 1,
                        _ => break,
                    }
                }
                ok
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    w.child.kill().expect("kill -9");
    let _ = w.child.wait();
    let sent: u64 = load.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let db = p.dir.join("data/short-url.db");
    let w2 = Weir::spawn(&p);
    w2.wait_ready(p.node());
    let r = call(&p, None, "GET", "?page_size=100", None).json();
    let total: i64 = r["data"]["items"]
        .as_array()
        .map(|a| a.iter().map(|l| l["visits"]["total"].as_i64().unwrap_or(0)).sum())
        .unwrap_or(0);
    let rows: i64 = codes
        .iter()
        .map(|c| {
            call(&p, None, "GET", &format!("/{c}/visits?page_size=1"), None).json()["data"]["by_class"]["other"]
                .as_i64()
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(total, rows, "counters equal the rows: batches are whole");
    assert!(total >= 200, "flushed visits survive: {total}");
    assert!(total <= 200 + sent as i64, "{total} > 200 + {sent} sent");
    for (code, origin) in &links {
        let r = get(p.node(), &format!("/s/{code}"));
        assert_eq!((r.status, r.header("location")), (302, Some(origin.as_str())), "{code} intact after kill -9");
    }

    assert!(db.exists());
}

/// 5,200 matches over 52 pages: whichever way each page is found (SQLite: the trigram index or
/// the walk of the list's order; PostgreSQL: the first 1,000 links of the order, or, past
/// them, more matches than it sorts from the codes found, so longer prefixes; see
/// store::links::list), every match comes once, nothing else.
fn common_search_term(pg: Option<&str>) {
    let (p, _w) = gateway(pg, "", "");
    for batch in 0..52 {
        let many: Vec<Value> = (0..100)
            .map(|i| json!({"origin_url": format!("https://common.example/{}", batch * 100 + i), "tags": ["bulk"]}))
            .collect();
        assert_eq!(create_as(&p, None, &json!(many)).status, 200);
    }
    let rare: Vec<Value> = (0..3).map(|i| json!({"origin_url": format!("https://rare.example/{i}")})).collect();
    assert_eq!(create_as(&p, None, &json!(rare)).status, 200);
    let mut seen = Vec::new();
    for page in 1..=53 {
        let list = call(&p, None, "GET", &format!("?search=COMMON.example&page_size=100&page={page}"), None).json();
        assert_eq!(list["data"]["has_more"], page < 52, "page {page}");
        for item in list["data"]["items"].as_array().into_iter().flatten() {
            assert!(item["origin_url"].as_str().is_some_and(|u| u.starts_with("https://common.example/")), "{item}");
            seen.push(item["short_code"].as_str().unwrap_or_default().to_owned());
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (5200, 5200));
    // With a filter that keeps none of them, and ordered by visits.
    assert!(codes(&call(&p, None, "GET", "?search=common.example&tag=none", None).json()).is_empty());
    assert_eq!(
        codes(&call(&p, None, "GET", "?search=common.example&order_by=-visits&page_size=7", None).json()).len(),
        7
    );
    // Terms held by fewer links: three, and one of the common ones (by its number).
    assert_eq!(codes(&call(&p, None, "GET", "?search=rare.example", None).json()).len(), 3);
    let one = call(&p, None, "GET", "?search=common.example%2F4321", None).json();
    assert_eq!(one["data"]["items"].as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(one["data"]["items"][0]["origin_url"], "https://common.example/4321");
}

#[test]
fn a_common_search_term_pages_through_every_match_once() {
    common_search_term(None);
}

#[test]
fn a_common_search_term_pages_through_every_match_once_on_postgres() {
    let Some(db) = pg::PgDb::fresh("common") else { return };
    common_search_term(Some(db.url()));
}

/// A MaxMind DB file (format 2.0, IPv4, 24-bit records) mapping `net`/`bits` to a Country
/// record with `iso` as its country's ISO code, built byte by byte as the format describes.
fn mmdb(net: [u8; 4], bits: usize, iso: &str) -> Vec<u8> {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.push(0x40 | s.len() as u8);
        out.extend_from_slice(s.as_bytes());
    }
    let nodes = bits;
    let not_found = nodes as u32;
    let data_pointer = nodes as u32 + 16;
    let mut out = Vec::new();
    for i in 0..nodes {
        let bit = (net[i / 8] >> (7 - i % 8)) & 1;
        let next = if i + 1 == nodes { data_pointer } else { i as u32 + 1 };
        let (left, right) = if bit == 0 { (next, not_found) } else { (not_found, next) };
        out.extend_from_slice(&left.to_be_bytes()[1..]);
        out.extend_from_slice(&right.to_be_bytes()[1..]);
    }
    out.extend_from_slice(&[0; 16]);
    // {"country": {"iso_code": iso}}
    out.push(0xE1);
    text(&mut out, "country");
    out.push(0xE1);
    text(&mut out, "iso_code");
    text(&mut out, iso);
    out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
    out.push(0xE9);
    text(&mut out, "binary_format_major_version");
    out.extend_from_slice(&[0xA1, 2]);
    text(&mut out, "binary_format_minor_version");
    out.push(0xA0);
    text(&mut out, "build_epoch");
    out.extend_from_slice(&[0x01, 9 - 7, 1]);
    text(&mut out, "database_type");
    text(&mut out, "Test-Country");
    text(&mut out, "description");
    out.push(0xE1);
    text(&mut out, "en");
    text(&mut out, "test");
    text(&mut out, "ip_version");
    out.extend_from_slice(&[0xA1, 4]);
    text(&mut out, "languages");
    out.extend_from_slice(&[0x01, 11 - 7]);
    text(&mut out, "en");
    text(&mut out, "node_count");
    out.extend_from_slice(&[0xC1, nodes as u8]);
    text(&mut out, "record_size");
    out.extend_from_slice(&[0xA1, 24]);
    out
}

#[test]
fn visits_carry_their_country_from_a_geoip_database() {
    let attr = "plugin_attr:\n  short-url:\n    geoip_database: geo/country.mmdb\n    visits: {flush_interval: 0.2}\n";
    let p = Prefix::new("", attr, "");
    p.write_resources(&resources(&p, ""));
    // A file that is not a MaxMind DB: the configuration is refused, naming the file.
    std::fs::create_dir_all(p.dir.join("geo")).expect("geo dir");
    std::fs::write(p.dir.join("geo/country.mmdb"), b"not a database").expect("write");
    let (code, out) = run_weir(&["-t", "-p", &path_str(&p.dir)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("geoip_database") && out.contains("geo/country.mmdb"), "{out}");
    // Loopback is in Germany here.
    std::fs::write(p.dir.join("geo/country.mmdb"), mmdb([127, 0, 0, 0], 8, "DE")).expect("write");
    let (code, out) = run_weir(&["-t", "-p", &path_str(&p.dir)]);
    assert_eq!(code, 0, "{out}");
    let w = Weir::spawn(&p);
    w.wait_ready(p.node());
    let code = code_of(&create_as(&p, None, &json!([{"origin_url": "https://geo.example/"}])).json()["data"][0]);
    assert_eq!(browser(&p, &code, "https://news.example/").status, 302);
    let recent = || call(&p, None, "GET", &format!("/{code}/visits"), None).json()["data"]["recent"].clone();
    assert!(eventually(Duration::from_secs(5), || recent()[0]["country"] == "DE"), "{}", recent());
}
