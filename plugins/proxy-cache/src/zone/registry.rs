//! The process's zones: the definitions of `gateway.proxy_cache` (recorded by `init`, also
//! under `weir -t`), and the zones opened from them, each once, when the first configuration
//! naming it is built for serving. Zones live as long as the process: a reload rebuilds routes,
//! not caches. A reload that brings other zone definitions keeps the running ones (the section
//! takes effect on restart, as the other `gateway` settings do).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use weir_plugin::cache_zones::{CacheZone, ProxyCacheSection};

use super::Zone;

struct Registry {
    section: ProxyCacheSection,
    open: HashMap<String, Arc<Zone>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// Records the zone definitions (first call), or checks that a later call brings the same.
pub fn init(section: &ProxyCacheSection) -> Result<(), String> {
    section.cache_ttl_secs()?;
    let mut reg = REGISTRY.lock();
    match &*reg {
        None => *reg = Some(Registry { section: section.clone(), open: HashMap::new() }),
        Some(r) if r.section == *section => {}
        Some(_) => log::warn!("proxy-cache: gateway.proxy_cache changed; the zones change at the next restart"),
    }
    Ok(())
}

/// The definition of zone `name` and the disk zones' default time to live (seconds).
pub fn definition(name: &str) -> Result<(CacheZone, u64), String> {
    let reg = REGISTRY.lock();
    let r = reg.as_ref().ok_or("the plugin was not initialised")?;
    let ttl = r.section.cache_ttl_secs()?;
    match r.section.zone(name) {
        Some(z) => Ok((z.clone(), ttl)),
        None => {
            let names: Vec<&str> = r.section.zones.iter().map(|z| z.name.as_str()).collect();
            Err(format!("cache_zone `{name}` is not a zone of gateway.proxy_cache (zones: {})", names.join(", ")))
        }
    }
}

/// Zone `name`, opened on first use.
pub fn open(name: &str) -> Result<Arc<Zone>, String> {
    let (def, _) = definition(name)?;
    let mut reg = REGISTRY.lock();
    let r = reg.as_mut().ok_or("the plugin was not initialised")?;
    if let Some(z) = r.open.get(name) {
        return Ok(z.clone());
    }
    let zone = Arc::new(if def.is_disk() {
        Zone::open_disk(&def)?
    } else {
        Zone::memory(&def.name, def.memory_size.bytes()?)
    });
    r.open.insert(name.to_owned(), zone.clone());
    Ok(zone)
}

/// Every opened zone, by name.
pub fn opened() -> Vec<Arc<Zone>> {
    let reg = REGISTRY.lock();
    let mut zones: Vec<Arc<Zone>> = reg.as_ref().map(|r| r.open.values().cloned().collect()).unwrap_or_default();
    zones.sort_by(|a, b| a.name.cmp(&b.name));
    zones
}
