//! A fresh PostgreSQL database per test, on the server `WEIR_TEST_POSTGRES_URL` names, dropped
//! again when the test ends (the server would otherwise collect one per test run).

use super::skip;

/// A database of its own for one test; dropped with this value. Declare it before the gateways
/// that use it, so that they stop (and close their connections) first.
pub struct PgDb {
    url: url::Url,
    admin: String,
    name: String,
}

impl PgDb {
    /// A fresh database named after `test` and this process, or None (the test is skipped)
    /// without `WEIR_TEST_POSTGRES_URL`.
    pub fn fresh(test: &str) -> Option<PgDb> {
        let Some(admin) = std::env::var("WEIR_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()) else {
            skip(test, "set WEIR_TEST_POSTGRES_URL to a PostgreSQL the tests may create databases in (.ci/run does)");
            return None;
        };
        let name = format!("weir_{test}_{}", std::process::id());
        let mut c = postgres::Client::connect(&admin, postgres::NoTls).expect("connect to WEIR_TEST_POSTGRES_URL");
        let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        c.batch_execute(&format!("CREATE DATABASE {name}")).expect("create test database");
        let mut url = url::Url::parse(&admin).expect("WEIR_TEST_POSTGRES_URL is a URL");
        url.set_path(&name);
        Some(PgDb { url, admin, name })
    }

    /// The database's connection URL.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The database's connection URL, parsed.
    pub fn parsed(&self) -> &url::Url {
        &self.url
    }

    /// A client of the database, for a test's own checks.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(self.url(), postgres::NoTls).expect("connect to the test database")
    }
}

/// The first column of the first row of `sql`, a count, or -1 when the statement fails (a
/// missing table, say), so that an assertion on it fails with the value.
pub fn count(c: &mut postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).map(|r| r.get(0)).unwrap_or(-1)
}

impl Drop for PgDb {
    fn drop(&mut self) {
        // FORCE: a gateway that outlived the test may still hold connections.
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}
