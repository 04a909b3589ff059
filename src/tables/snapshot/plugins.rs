//! Plugin configurations of a snapshot: enabled plugins, consumers (their credentials and their
//! other plugins), metadata, `_meta`, and the chains of instances. Instances are reused from the
//! snapshot this one replaces while their plugin, owner, configuration and metadata are
//! unchanged, so one route change rebuilds that route's instances only.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use weir_plugin::meta::{meta_of, META};
use weir_plugin::{BuildContext, ConsumerDirectory, ConsumerRef, Owner, SharedState};

use super::*;
use crate::resources::secrets::{self, Resolved};

/// Consumers as requests carry them, and what auth plugins derived from their credentials.
pub(crate) struct ConsumerState {
    /// Fingerprint of the `consumers` list (and the plugin metadata) this was built from.
    print: Fingerprint,
    /// Every consumer by name.
    pub directory: ConsumerDirectory,
    /// Each auth plugin's state (`prepare_consumers`).
    pub shared: HashMap<&'static str, SharedState>,
}

/// Per plugin that checks its configurations together: the plugin and each configuration with
/// its owner `(kind, id, label)`.
pub(super) type Together = HashMap<&'static str, (Arc<PluginEntry>, Vec<(&'static str, String, String, Value)>)>;

/// `(kind, id, label)` of the resource a chain belongs to.
pub(super) type ChainOwner<'o> = (&'static str, &'o str, &'o EntryName<'o>);

/// Sorts by priority (descending), then name.
pub(super) fn sort_chain(chain: &mut [BoundPlugin]) {
    chain.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.entry.name.cmp(b.entry.name)));
}

/// `base` plugins overridden by `over` plugins of the same name: service ⊕ route, and a
/// request's chain ⊕ its consumer's plugins (the consumer's win, as in APISIX).
pub fn merge_chains(base: &PluginChain, over: &PluginChain) -> PluginChain {
    let mut merged: Vec<BoundPlugin> =
        base.iter().filter(|s| !over.iter().any(|r| r.entry.name == s.entry.name)).cloned().collect();
    merged.extend(over.iter().cloned());
    Arc::new(Chain::from(merged))
}

impl Builder<'_> {
    pub(super) fn enabled_plugin(&mut self, o: &EntryName<'_>, path: &str, name: &str) -> Option<Arc<PluginEntry>> {
        match enabled_entry(self.enabled, name) {
            Ok(e) => Some(e),
            Err(reason) => {
                self.issue(o, path, &reason);
                None
            }
        }
    }

    /// `conf` with its secret references (`$env://`) resolved and checked against `schema`
    /// ([`checked`]); the issues found go to the builder, under `path` of resource `o`.
    fn resolved<'c>(
        &mut self,
        o: &EntryName<'_>,
        path: &str,
        conf: &'c Value,
        schema: &CompiledSchema,
    ) -> Option<Resolved<'c>> {
        match checked(conf, schema) {
            Ok(r) => Some(r),
            Err(found) => {
                self.issues.extend(found.into_iter().map(|f| f.under(path).in_resource(o)));
                None
            }
        }
    }

    /// Consumers with their plugins: a plugin with a consumer schema is a credential (indexed
    /// by the plugin), any other is built into the consumer's own chain, merged into a request's
    /// once the consumer is known. Credentials with an id of their own (a consumer's
    /// `credentials`, or top-level `credentials` entries) identify the consumer with that id as
    /// `credential_id`. Reused whole from the previous snapshot while the consumers, their
    /// credentials, groups and plugin metadata are unchanged.
    pub(super) fn consumer_state(
        &mut self,
        raw: &Value,
        consumers: &[(EntryName<'_>, Arc<Consumer>)],
        groups: &[(EntryName<'_>, Arc<ConsumerGroup>)],
        credentials: &[(EntryName<'_>, Arc<Credential>)],
        metadata: &HashMap<String, PluginMetadata>,
    ) -> Arc<ConsumerState> {
        let mut print = fingerprint("consumers", raw.get("consumers").unwrap_or(&Value::Null));
        for (i, list) in ["consumer_groups", "plugin_metadata", "credentials"].into_iter().enumerate() {
            let other = fingerprint(list, raw.get(list).unwrap_or(&Value::Null));
            print[0] ^= other[0].rotate_left(i as u32 + 1);
            print[1] ^= other[1].rotate_left(i as u32 + 1);
        }
        // Not in a validation: a reused state would skip what its consumers' plugins check
        // together with the routes' (`check_together`).
        if let Some(previous) = self.previous.filter(|_| !self.check_only).and_then(|p| p.consumer_state.as_ref()) {
            if previous.print == print {
                return previous.clone();
            }
        }
        let empty = ConsumerState { print, directory: ConsumerDirectory::default(), shared: HashMap::new() };
        let mut people = Vec::with_capacity(consumers.len());
        type Credentials = (Arc<PluginEntry>, Vec<(Arc<weir_plugin::Consumer>, Value)>);
        let mut per_plugin: HashMap<&'static str, Credentials> = HashMap::new();
        // Top-level credentials by consumer (one pass, not one per consumer).
        let mut top_level: HashMap<&str, Vec<&(EntryName<'_>, Arc<Credential>)>> = HashMap::new();
        for entry in credentials {
            if let Some(name) = entry.1.consumer.as_deref() {
                top_level.entry(name).or_default().push(entry);
            }
        }
        for (o, c) in consumers {
            let mut others = PluginConfs::new();
            let group = c.group_id.as_ref().and_then(|g| groups.iter().find(|(_, x)| x.id == *g));
            if let Some((go, g)) = group {
                for (name, conf) in &g.plugins {
                    let path = format!("plugins.{name}");
                    let Some(entry) = self.enabled_plugin(go, &path, name) else { continue };
                    if entry.consumer_schema.is_some() {
                        self.issue(go, &path, "credentials belong to consumers, not to consumer groups");
                        continue;
                    }
                    others.insert(name.clone(), conf.clone());
                }
            }
            // `(owner, path of its plugins, credential id, plugins)`: the consumer's own plugins,
            // then each of its credentials.
            let mut sources: Vec<(&EntryName<'_>, String, Option<&Id>, &PluginConfs)> =
                vec![(o, "plugins".into(), None, &c.plugins)];
            for (j, cred) in c.credentials.iter().enumerate() {
                sources.push((o, format!("credentials[{j}].plugins"), Some(&cred.id), &cred.plugins));
            }
            for (co, cred) in top_level.get(c.username.as_str()).into_iter().flatten() {
                sources.push((co, "plugins".into(), Some(&cred.id), &cred.plugins));
            }
            let mut found: Vec<(Arc<PluginEntry>, Value, Option<&Id>)> = Vec::new();
            for (owner, at, credential, plugins) in sources {
                for (name, conf) in plugins {
                    let path = format!("{at}.{name}");
                    let Some(entry) = self.enabled_plugin(owner, &path, name) else { continue };
                    let holder = entry.clone();
                    let Some(schema) = holder.consumer_schema.as_ref() else {
                        if credential.is_some() {
                            self.issue(owner, &path, "a credential holds auth plugins' credentials only");
                        } else {
                            others.insert(name.clone(), conf.clone());
                        }
                        continue;
                    };
                    let Some(resolved) = self.resolved(owner, &path, conf, schema) else { continue };
                    found.push((entry, resolved.value.into_owned(), credential));
                }
            }
            let chain = if others.is_empty() {
                None
            } else {
                let chain = self.chain(("consumers", &c.username, o), &others, &empty, metadata);
                Some(Arc::new(chain) as Arc<dyn std::any::Any + Send + Sync>)
            };
            let person = Arc::new(weir_plugin::Consumer {
                username: Arc::from(c.username.as_str()),
                group_id: c.group_id.as_ref().map(|g| Arc::from(g.0.as_str())),
                labels: c.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                credential_id: None,
                username_header: http::HeaderValue::from_str(&c.username).ok(),
                plugins: chain,
            });
            for (entry, conf, credential) in found {
                let who = match credential {
                    None => person.clone(),
                    Some(id) => Arc::new(weir_plugin::Consumer {
                        credential_id: Some(Arc::from(id.0.as_str())),
                        ..(*person).clone()
                    }),
                };
                per_plugin.entry(entry.name).or_insert_with(|| (entry.clone(), Vec::new())).1.push((who, conf));
            }
            people.push(person);
        }
        let mut shared = HashMap::new();
        for (name, (entry, confs)) in per_plugin {
            let refs: Vec<ConsumerRef<'_>> =
                confs.iter().map(|(who, conf)| ConsumerRef { username: &who.username, consumer: who, conf }).collect();
            match entry.plugin.prepare_consumers(&refs) {
                Ok(Some(state)) => {
                    shared.insert(name, state);
                }
                Ok(None) => {}
                Err(e) => self.issues.push(Issue::new(format!("consumers: plugins.{name}"), e)),
            }
        }
        Arc::new(ConsumerState { print, directory: ConsumerDirectory::new(people), shared })
    }

    pub(super) fn check_metadata(&mut self, o: &EntryName<'_>, m: &PluginMetadata) -> bool {
        let Some(entry) = self.enabled.get(&m.id).cloned() else {
            if crate::plugins_catalog().get(&m.id).is_some() {
                log::info!("{o}: metadata of plugin `{}` is ignored: the plugin is not enabled", m.id);
            } else {
                let known: Vec<String> = self.enabled.listed.iter().map(|e| e.name.to_owned()).collect();
                self.issue(o, "id", &unknown_plugin(&m.id, &known));
            }
            return false;
        };
        let Some(schema) = &entry.metadata_schema else {
            self.issue(o, "id", &format!("plugin `{}` takes no metadata", m.id));
            return false;
        };
        if let Err(found) = schema.check(&Value::Object(m.fields.clone())) {
            self.issues.extend(found.into_iter().map(|f| f.in_resource(o)));
            return false;
        }
        true
    }

    /// The chain of one resource's plugins: each configuration checked against its schema, its
    /// `_meta` applied, and its instance taken from the previous snapshot when unchanged.
    pub(super) fn chain(
        &mut self,
        (kind, id, o): ChainOwner<'_>,
        confs: &PluginConfs,
        consumers: &ConsumerState,
        metadata: &HashMap<String, PluginMetadata>,
    ) -> PluginChain {
        let mut chain = Vec::with_capacity(confs.len());
        for (name, conf) in confs {
            let path = format!("plugins.{name}");
            let Some(entry) = self.enabled_plugin(o, &path, name) else { continue };
            let Some(resolved) = self.resolved(o, &path, conf, &entry.schema) else { continue };
            let meta = match meta_of(conf) {
                Ok(m) => m.unwrap_or_default(),
                Err(e) => {
                    self.issue(o, &path, &e);
                    continue;
                }
            };
            let filter = match meta.filter.map(|f| weir_plugin::expr::Expr::compile(&Value::Array(f))) {
                None => None,
                Some(Ok(e)) => Some(Arc::new(e)),
                Some(Err(why)) => {
                    let (at, why) = why.split_once(": ").unwrap_or(("", &why));
                    self.issue(o, &format!("{path}.{META}.filter{at}"), why);
                    continue;
                }
            };
            if meta.disable {
                continue;
            }
            if entry.plugin.checks_together() {
                let (_, confs) = self.together.entry(entry.name).or_insert_with(|| (entry.clone(), Vec::new()));
                confs.push((kind, id.to_owned(), String::from(&**o), conf.clone()));
            }
            let meta_value = metadata.get(name).map(|m| Value::Object(m.fields.clone()));
            let built = self.instance(&entry, (kind, id, o), (conf, &resolved), meta_value.as_ref(), consumers, &path);
            let Some(instance) = built else { continue };
            let error_response = meta.error_response.map(|v| match v {
                Value::String(s) => ErrorBody { body: Bytes::from(s), content_type: "text/plain; charset=utf-8" },
                other => ErrorBody { body: Bytes::from(other.to_string()), content_type: "application/json" },
            });
            chain.push(BoundPlugin {
                priority: meta.priority.unwrap_or(entry.priority),
                late: instance.late(),
                entry,
                instance,
                error_response,
                filter,
            });
        }
        Arc::new(Chain::from(chain))
    }

    /// `Plugin::check_together` of every plugin that asked, on this document's configurations.
    pub(super) fn check_together(&mut self) {
        for (name, (entry, confs)) in std::mem::take(&mut self.together) {
            let owners: Vec<(Owner<'_>, &Value)> =
                confs.iter().map(|(kind, id, label, conf)| (Owner { kind, id, label }, conf)).collect();
            for (i, why) in entry.plugin.check_together(&owners) {
                if let Some((_, _, label, _)) = confs.get(i) {
                    self.issue(label, &format!("plugins.{name}"), &why);
                }
            }
        }
    }

    /// One instance: the previous snapshot's for the same plugin, owner, configuration and
    /// metadata (and, for auth plugins, unchanged consumers), else a new one.
    pub(super) fn instance(
        &mut self,
        entry: &Arc<PluginEntry>,
        (kind, id, o): ChainOwner<'_>,
        (conf, resolved): (&Value, &Resolved<'_>),
        metadata: Option<&Value>,
        consumers: &ConsumerState,
        path: &str,
    ) -> Option<Arc<dyn PluginInstance>> {
        let owner = owner_key(kind, id);
        let conf_print = fingerprint(entry.name, conf);
        let meta_print = metadata.map_or([0, 0], |m| fingerprint("plugin_metadata", m));
        let consumers_reused = self
            .previous
            .and_then(|p| p.consumer_state.as_ref())
            .is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), consumers));
        // Auth plugins hold consumers (multi-auth through the auth plugins it runs).
        let depends_on_consumers = entry.consumer_schema.is_some() || entry.plugin.plugin_type() == Some("auth");
        if !self.check_only && (consumers_reused || !depends_on_consumers) {
            let same_ids = self.previous.is_some_and(|p| p.upstream_ids == self.snap.upstream_ids);
            // One that named upstreams is reused only while the same upstream ids exist.
            let found = self.previous.and_then(|p| p.instances.get(&owner)).and_then(|list| {
                list.iter().find(|r| {
                    r.plugin == entry.name
                        && r.conf == conf_print
                        && r.meta == meta_print
                        && (!r.names_upstreams || same_ids)
                })
            });
            if let Some(found) = found.cloned() {
                let instance = found.instance.clone();
                self.keep_instance(&owner, found);
                return Some(instance);
            }
        }
        let services = Nested {
            enabled: self.enabled,
            consumers,
            check_only: self.check_only,
            index: self.known(),
            names_upstreams: std::sync::atomic::AtomicBool::new(false),
        };
        let ctx = BuildContext {
            owner: Owner { kind, id, label: o },
            raw: &resolved.value,
            metadata,
            shared: consumers.shared.get(entry.name),
            check_only: self.check_only,
            consumers: &consumers.directory,
            services: &services,
        };
        let built = entry.plugin.build(&resolved.value, &ctx);
        let names_upstreams = services.names_upstreams.load(std::sync::atomic::Ordering::Relaxed);
        match built {
            Ok(instance) => {
                if !self.check_only {
                    let reusable = Reusable {
                        plugin: entry.name,
                        conf: conf_print,
                        meta: meta_print,
                        instance: instance.clone(),
                        names_upstreams,
                    };
                    self.keep_instance(&owner, reusable);
                }
                Some(instance)
            }
            Err(e) => {
                self.issue(o, path, &resolved.redact(&e));
                None
            }
        }
    }
}

impl Builder<'_> {
    /// Records an instance of this build for the next one to reuse.
    fn keep_instance(&mut self, owner: &str, reusable: Reusable) {
        self.snap.instances.get_or_insert_with(owner, || (owner.to_owned(), Vec::new())).push(reusable);
    }
}

/// The enabled plugin `name`, or why there is none (not enabled, or unknown with a suggestion).
fn enabled_entry(enabled: &EnabledSet, name: &str) -> Result<Arc<PluginEntry>, String> {
    if let Some(e) = enabled.get(name) {
        return Ok(e.clone());
    }
    Err(if crate::plugins_catalog().get(name).is_some() {
        format!("plugin `{name}` is compiled in but not enabled (add it to `plugins:` in config.yaml)")
    } else {
        let known: Vec<String> = enabled.listed.iter().map(|e| e.name.to_owned()).collect();
        unknown_plugin(name, &known)
    })
}

/// `conf` with its secret references (`$env://`) resolved, checked against `schema`; the issues
/// (paths relative to `conf`) name a secret by its reference, never its value.
fn checked<'c>(conf: &'c Value, schema: &CompiledSchema) -> Result<Resolved<'c>, Vec<Issue>> {
    let resolved = secrets::resolve(conf).map_err(|(at, why)| vec![Issue::new(at, why)])?;
    match schema.check(&resolved.value) {
        Ok(()) => Ok(resolved),
        Err(found) => Err(found.into_iter().map(|f| Issue::new(f.path, resolved.redact(&f.reason))).collect()),
    }
}

/// The host's services while a snapshot is built, which can also build other plugins'
/// instances (`Services::build_plugin`, for multi-auth) with this snapshot's consumers.
struct Nested<'b> {
    enabled: &'b EnabledSet,
    consumers: &'b ConsumerState,
    check_only: bool,
    /// The resources that exist, by `(kind, id)` (this build's, or in a patch the snapshot
    /// patched): which upstream objects exist.
    index: &'b FastMap<(&'static str, String), usize>,
    /// The instance named upstream objects by id (reused only while the same ids exist).
    names_upstreams: std::sync::atomic::AtomicBool,
}

impl weir_plugin::Services for Nested<'_> {
    fn http_client(&self) -> Arc<dyn weir_plugin::HttpClient> {
        crate::tables::services::HostServices.http_client()
    }

    fn compile_upstream(&self, conf: &Value) -> Result<weir_plugin::UpstreamRef, String> {
        crate::tables::services::HostServices.compile_upstream(conf)
    }

    fn upstream_by_id(&self, id: &str) -> Result<weir_plugin::UpstreamRef, String> {
        self.names_upstreams.store(true, std::sync::atomic::Ordering::Relaxed);
        if self.index.contains_key(&("upstreams", id.to_owned())) {
            Ok(weir_plugin::UpstreamRef::Id(Arc::from(id)))
        } else {
            Err(format!("upstream `{id}` does not exist"))
        }
    }

    fn build_plugin(
        &self,
        name: &str,
        conf: &Value,
        owner: Owner<'_>,
    ) -> Result<(Arc<dyn PluginInstance>, Option<&'static str>), String> {
        let entry = enabled_entry(self.enabled, name)?;
        let resolved = checked(conf, &entry.schema)
            .map_err(|found| found.into_iter().map(|i| i.under(name).to_string()).collect::<Vec<_>>().join("; "))?;
        let ctx = BuildContext {
            owner,
            raw: &resolved.value,
            metadata: None,
            shared: self.consumers.shared.get(entry.name),
            check_only: self.check_only,
            consumers: &self.consumers.directory,
            services: self,
        };
        let instance =
            entry.plugin.build(&resolved.value, &ctx).map_err(|e| resolved.redact(&format!("{name}: {e}")))?;
        Ok((instance, entry.plugin.plugin_type()))
    }
}
