//! The plugin catalog (every plugin compiled into this binary, collected at link time) and the
//! enabled set (the subset config.yaml's `plugins:` turns on).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use weir_plugin::{DynPlugin, StreamPlugin};

use crate::validate::CompiledSchema;

/// One compiled-in plugin with its schemas compiled.
pub struct PluginEntry {
    /// The plugin.
    pub plugin: Box<dyn DynPlugin>,
    /// Its name.
    pub name: &'static str,
    /// Its priority.
    pub priority: i32,
    /// Configuration schema.
    pub schema: CompiledSchema,
    /// Consumer schema, if any.
    pub consumer_schema: Option<CompiledSchema>,
    /// Metadata schema, if any.
    pub metadata_schema: Option<CompiledSchema>,
    /// `plugin_attr` schema, if any.
    pub attr_schema: Option<CompiledSchema>,
}

impl PluginEntry {
    fn new(plugin: Box<dyn DynPlugin>) -> Result<Self, String> {
        let name = plugin.name();
        let compile =
            |s: Value, what: &str| CompiledSchema::new(s).map_err(|e| format!("plugin `{name}`: {what}: {e}"));
        Ok(PluginEntry {
            name,
            priority: plugin.priority(),
            schema: compile(plugin.schema(), "schema")?,
            consumer_schema: plugin.consumer_schema().map(|s| compile(s, "consumer_schema")).transpose()?,
            metadata_schema: plugin.metadata_schema().map(|s| compile(s, "metadata_schema")).transpose()?,
            attr_schema: plugin.attr_schema().map(|s| compile(s, "attr_schema")).transpose()?,
            plugin,
        })
    }

    /// The per-plugin object of `/v1/schema`.
    pub fn describe(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("schema".into(), self.schema.schema().clone());
        if let Some(s) = &self.consumer_schema {
            obj.insert("consumer_schema".into(), s.schema().clone());
        }
        if let Some(s) = &self.metadata_schema {
            obj.insert("metadata_schema".into(), s.schema().clone());
        }
        if let Some(t) = self.plugin.plugin_type() {
            obj.insert("type".into(), json!(t));
        }
        obj.insert("priority".into(), json!(self.priority));
        obj.insert("version".into(), json!(self.plugin.version()));
        Value::Object(obj)
    }
}

/// One compiled-in stream plugin with its schema compiled.
pub struct StreamEntry {
    /// The plugin.
    pub plugin: Box<dyn StreamPlugin>,
    /// Its name.
    pub name: &'static str,
    /// Its priority.
    pub priority: i32,
    /// Configuration schema.
    pub schema: CompiledSchema,
}

impl StreamEntry {
    fn new(plugin: Box<dyn StreamPlugin>) -> Result<Self, String> {
        let name = plugin.name();
        let schema =
            CompiledSchema::new(plugin.schema()).map_err(|e| format!("stream plugin `{name}`: schema: {e}"))?;
        Ok(StreamEntry { name, priority: plugin.priority(), schema, plugin })
    }

    /// The per-plugin object of `/v1/schema`'s `stream-plugins`.
    pub fn describe(&self) -> Value {
        json!({
            "schema": self.schema.schema(),
            "priority": self.priority,
            "version": self.plugin.version(),
        })
    }
}

/// Every plugin compiled into the binary, sorted by priority (descending) then name; HTTP and
/// stream plugins apart.
pub struct Catalog {
    entries: Vec<Arc<PluginEntry>>,
    stream: Vec<Arc<StreamEntry>>,
}

impl Catalog {
    /// Collects the plugins registered at link time. Two plugins with one name are an error.
    pub fn discover() -> Result<Catalog, String> {
        let mut catalog = Self::from_plugins(weir_plugin::registered().map(|r| (r.make)()).collect())?;
        for r in weir_plugin::stream::registered_stream() {
            let entry = StreamEntry::new((r.make)())?;
            if catalog.stream.iter().any(|e| e.name == entry.name) {
                return Err(format!("two stream plugins are named `{}`; plugin names must be unique", entry.name));
            }
            catalog.stream.push(Arc::new(entry));
        }
        catalog.stream.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
        Ok(catalog)
    }

    /// A catalog of the given plugins (tests build their own).
    pub fn from_plugins(plugins: Vec<Box<dyn DynPlugin>>) -> Result<Catalog, String> {
        let mut entries = Vec::with_capacity(plugins.len());
        for p in plugins {
            let entry = PluginEntry::new(p)?;
            if entries.iter().any(|e: &Arc<PluginEntry>| e.name == entry.name) {
                return Err(format!("two plugins are named `{}`; plugin names must be unique", entry.name));
            }
            entries.push(Arc::new(entry));
        }
        entries.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
        Ok(Catalog { entries, stream: Vec::new() })
    }

    /// A catalog without plugins.
    pub fn empty() -> Catalog {
        Catalog { entries: Vec::new(), stream: Vec::new() }
    }

    /// A stream plugin by name.
    pub fn stream_get(&self, name: &str) -> Option<&Arc<StreamEntry>> {
        self.stream.iter().find(|e| e.name == name)
    }

    /// Stream plugin names, in priority order.
    pub fn stream_names(&self) -> Vec<String> {
        self.stream.iter().map(|e| e.name.to_owned()).collect()
    }

    /// Every compiled-in stream plugin.
    pub fn stream_entries(&self) -> &[Arc<StreamEntry>] {
        &self.stream
    }

    /// A plugin by name.
    pub fn get(&self, name: &str) -> Option<&Arc<PluginEntry>> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Names, in priority order.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.name.to_owned()).collect()
    }

    /// The enabled subset named by `names` (unknown names are skipped: config validation
    /// already refused them).
    pub fn enable(&self, names: &[String]) -> EnabledSet {
        let listed: Vec<Arc<PluginEntry>> = names.iter().filter_map(|n| self.get(n).cloned()).collect();
        let mut by_priority = listed.clone();
        by_priority.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
        let index = listed.iter().map(|e| (e.name, e.clone())).collect();
        EnabledSet {
            schema_json: std::sync::OnceLock::new(),
            listed,
            by_priority,
            index,
            stream: Vec::new(),
            check_only: false,
        }
    }

    /// The enabled stream plugins named by `names`, in priority order.
    pub fn enable_stream(&self, names: &[String]) -> Vec<Arc<StreamEntry>> {
        let mut on: Vec<Arc<StreamEntry>> = names.iter().filter_map(|n| self.stream_get(n).cloned()).collect();
        on.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
        on
    }
}

/// The enabled plugins.
pub struct EnabledSet {
    /// The serialized `/v1/schema` document of this set, built on first request.
    pub schema_json: std::sync::OnceLock<bytes::Bytes>,
    /// In the order of config.yaml's `plugins:` list.
    pub listed: Vec<Arc<PluginEntry>>,
    /// By priority (descending), then name.
    pub by_priority: Vec<Arc<PluginEntry>>,
    index: HashMap<&'static str, Arc<PluginEntry>>,
    /// Enabled stream plugins, by priority (descending), then name.
    pub stream: Vec<Arc<StreamEntry>>,
    /// Built for `weir -t`: plugins validate but open nothing.
    pub check_only: bool,
}

impl EnabledSet {
    /// An enabled plugin by name.
    pub fn get(&self, name: &str) -> Option<&Arc<PluginEntry>> {
        self.index.get(name)
    }
    /// The `plugins` object of `/v1/schema`.
    pub fn describe(&self) -> Value {
        Value::Object(self.by_priority.iter().map(|e| (e.name.to_owned(), e.describe())).collect())
    }
    /// An enabled stream plugin by name.
    pub fn stream_get(&self, name: &str) -> Option<&Arc<StreamEntry>> {
        self.stream.iter().find(|e| e.name == name)
    }
    /// The `stream-plugins` object of `/v1/schema`.
    pub fn describe_stream(&self) -> Value {
        Value::Object(self.stream.iter().map(|e| (e.name.to_owned(), e.describe())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin::{BuildContext, Plugin, PluginInstance};

    struct Fake(&'static str, i32);
    impl Plugin for Fake {
        type Conf = serde_json::Map<String, Value>;
        fn name(&self) -> &'static str {
            self.0
        }
        fn priority(&self) -> i32 {
            self.1
        }
        fn build(&self, _: Self::Conf, _: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
            Err("not built in tests".into())
        }
    }

    #[test]
    fn duplicate_names_are_refused() {
        let err = Catalog::from_plugins(vec![Box::new(Fake("a", 1)), Box::new(Fake("a", 2))]).err();
        assert_eq!(err.as_deref(), Some("two plugins are named `a`; plugin names must be unique"));
    }

    #[test]
    fn sorted_by_priority_then_name() {
        let c = Catalog::from_plugins(vec![Box::new(Fake("b", 1)), Box::new(Fake("a", 1)), Box::new(Fake("z", 9))])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.names(), ["z", "a", "b"]);
        let enabled = c.enable(&["b".into(), "z".into()]);
        let listed: Vec<_> = enabled.listed.iter().map(|e| e.name).collect();
        assert_eq!(listed, ["b", "z"]);
        assert_eq!(enabled.describe().as_object().map(|o| o.len()), Some(2));
    }
}
