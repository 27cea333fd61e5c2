//! Which MongoDB-wire server the mongodb backend is on, from its
//! `buildInfo`: the gateway logs it at start and warns on a server where
//! several instances lose updates (docs/operating.md, "Servers").

/// What the server says it is (`buildInfo`), logged at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// The MongoDB version it implements (`version`).
    pub version: String,
    /// FerretDB's own version, when the server is FerretDB.
    pub ferretdb: Option<String>,
}

impl ServerInfo {
    /// From a `buildInfo` reply: FerretDB 2.x says `ferretdb: {version}`,
    /// FerretDB 1.x `ferretdbVersion`; MongoDB neither.
    pub fn from_build_info(info: &mongodb::bson::Document) -> Self {
        Self {
            version: info.get_str("version").unwrap_or("unknown").to_owned(),
            ferretdb: info
                .get_document("ferretdb")
                .ok()
                .map(|f| f.get_str("version").unwrap_or("unknown").to_owned())
                .or_else(|| info.get_str("ferretdbVersion").ok().map(str::to_owned)),
        }
    }

    /// A FerretDB 1.x: a filtered write is a read then a separate write
    /// there, so several gateway instances on it lose updates.
    pub fn is_ferretdb_1(&self) -> bool {
        self.ferretdb.as_deref().is_some_and(|v| v.trim_start_matches('v').starts_with("1."))
    }

    /// Whether the server serves a sort from an index only on `_id`:
    /// FerretDB (2.x over DocumentDB 0.107 orders only along its primary
    /// key; 1.x along none).
    pub fn orders_by_id_only(&self) -> bool {
        self.ferretdb.is_some()
    }

    /// Whether several instances on this server keep every guarantee of one
    /// (docs/operating.md, "Servers").
    pub fn supports_several_instances(&self) -> bool {
        !self.is_ferretdb_1()
    }
}

impl std::fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ferretdb {
            Some(ferretdb) => write!(f, "FerretDB {ferretdb} (MongoDB {} wire protocol)", self.version),
            None => write!(f, "MongoDB {}", self.version),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ServerInfo;

    fn server(version: &str, ferretdb: Option<&str>) -> ServerInfo {
        ServerInfo { version: version.into(), ferretdb: ferretdb.map(Into::into) }
    }

    #[test]
    fn several_instances_are_refused_only_on_ferretdb_1() {
        assert!(server("7.0.0", None).supports_several_instances());
        assert!(server("7.0.77", Some("v2.7.0")).supports_several_instances());
        assert!(!server("7.0.42", Some("v1.24.2")).supports_several_instances());
        assert!(!server("6.0.42", Some("1.10.0")).supports_several_instances());
        assert_eq!(server("7.0.77", Some("v2.7.0")).to_string(), "FerretDB v2.7.0 (MongoDB 7.0.77 wire protocol)");
        assert_eq!(server("8.0.4", None).to_string(), "MongoDB 8.0.4");
    }

    #[test]
    fn only_ferretdb_has_live_documents_read_along_id() {
        assert!(!server("7.0.0", None).orders_by_id_only(), "MongoDB reads them along the live index");
        assert!(server("7.0.77", Some("v2.7.0")).orders_by_id_only());
    }

    #[test]
    fn build_info_replies_of_each_server_are_read() {
        use mongodb::bson::doc;
        let of = |reply| ServerInfo::from_build_info(&reply);
        assert_eq!(of(doc! {"version": "7.0.14", "ok": 1.0}), server("7.0.14", None));
        let v2 = doc! {"version": "7.0.77", "ferretdb": {"version": "v2.7.0", "package": ""}, "ok": 1.0};
        assert_eq!(of(v2), server("7.0.77", Some("v2.7.0")));
        let v1 = of(doc! {"version": "7.0.42", "ferretdbVersion": "v1.24.2", "ok": 1.0});
        assert_eq!(v1, server("7.0.42", Some("v1.24.2")));
        assert!(!v1.supports_several_instances());
    }
}
