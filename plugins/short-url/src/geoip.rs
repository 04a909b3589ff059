//! The country of a visit, from a MaxMind DB file (GeoLite2 or GeoIP2, Country or City) when
//! `plugin_attr.short-url.geoip_database` names one. The file is read whole at load (a
//! country database is a few MB) and looked up on the redirect's path: a walk of at most 128
//! tree nodes and the decoding of one ISO code, no I/O.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// An opened database.
pub struct GeoIp {
    reader: maxminddb::Reader<Vec<u8>>,
    /// Where it came from (a reload with the same path and file keeps it).
    pub path: PathBuf,
}

/// The part of a Country or City record read here.
#[derive(Deserialize)]
struct Record<'a> {
    #[serde(borrow)]
    country: Option<Iso<'a>>,
}

#[derive(Deserialize)]
struct Iso<'a> {
    iso_code: Option<&'a str>,
}

impl GeoIp {
    /// Opens `path` (relative: under `prefix`); the error names the file and what is wrong.
    pub fn open(path: &str, prefix: &Path) -> Result<GeoIp, String> {
        let full = prefix.join(path);
        let reader = maxminddb::Reader::open_readfile(&full)
            .map_err(|e| format!("geoip_database: {}: not a readable MaxMind DB file ({e})", full.display()))?;
        if !reader.metadata.database_type.contains("Country") && !reader.metadata.database_type.contains("City") {
            log::warn!(
                "short-url: geoip_database {}: database type {:?} is neither a Country nor a City database; \
                 visits get a country only where its records carry country.iso_code",
                full.display(),
                reader.metadata.database_type
            );
        }
        Ok(GeoIp { reader, path: full })
    }

    /// The ISO 3166 code of `ip`'s country (`DE`), if the database knows it.
    pub fn country(&self, ip: &str) -> Option<String> {
        let ip: IpAddr = ip.parse().ok()?;
        let record: Record<'_> = self.reader.lookup(ip).ok().flatten()?;
        let code = record.country?.iso_code?;
        (code.len() == 2 && code.bytes().all(|b| b.is_ascii_alphabetic())).then(|| code.to_ascii_uppercase())
    }
}
