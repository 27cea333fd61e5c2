//! Query parameters an operation does not take are refused (422 at
//! `/query/<name>`), on every operation the API document describes: a
//! misspelled filter (`?stauts=pending`) is an error, not a listing of
//! everything. The parameters each operation takes are read from the
//! API document itself, so the two never disagree.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;
use crate::document::rules::{Invalid, escape};

/// The query parameters of each operation: by method and route as the
/// router matches it (`/v1/collections/{collection}/documents`).
#[derive(Debug, Default)]
pub(crate) struct Params(HashMap<(Method, String), Vec<String>>);

impl Params {
    /// The parameters `document` (an OpenAPI document) gives each
    /// operation: those `in: query`, whether at the operation or its path.
    pub(crate) fn of(document: &Value) -> Self {
        let mut known = HashMap::new();
        let Some(paths) = document["paths"].as_object() else { return Self(known) };
        let query_names = |params: &Value| -> Vec<String> {
            params
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect()
        };
        for (path, item) in paths {
            let shared = query_names(&item["parameters"]);
            for (method, op) in item.as_object().into_iter().flatten() {
                let Ok(method) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else { continue };
                if !op.is_object() || op.get("responses").is_none() {
                    continue;
                }
                let mut names = shared.clone();
                names.extend(query_names(&op["parameters"]));
                known.insert((method, path.clone()), names);
            }
        }
        Self(known)
    }

    /// Why `query` is refused for `method` on `route`: the first
    /// parameter the operation does not take. `None` when it takes them
    /// all, or when the document does not describe the operation.
    fn refused(&self, method: &Method, route: &str, query: &str) -> Option<Invalid> {
        // A HEAD is answered as its GET.
        let method = if method == Method::HEAD { &Method::GET } else { method };
        let names = self.0.get(&(method.clone(), route.to_owned()))?;
        for (name, _) in url::form_urlencoded::parse(query.as_bytes()) {
            if name.is_empty() {
                return Some(Invalid::new("/query", "a query parameter has no name"));
            }
            if !names.iter().any(|n| *n == name) {
                let takes = if names.is_empty() {
                    "it takes none".to_owned()
                } else {
                    format!("it takes {}", names.join(", "))
                };
                let pointer = format!("/query/{}", escape(&name));
                return Some(Invalid::new(pointer, format!("not a parameter of this operation ({takes})")));
            }
        }
        None
    }
}

/// Refuses a request with a query parameter its operation does not take.
pub(crate) async fn known_only(State(params): State<Arc<Params>>, req: Request, next: Next) -> Response {
    if let (Some(query), Some(route)) = (req.uri().query(), req.extensions().get::<MatchedPath>()) {
        if let Some(invalid) = params.refused(req.method(), route.as_str(), query) {
            return ApiError::from(invalid).into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_takes_the_parameters_its_document_names() {
        let doc = serde_json::json!({"paths": {
            "/v1/things": {
                "get": {"parameters": [{"name": "limit", "in": "query"}, {"name": "x-id", "in": "header"}],
                        "responses": {}},
                "post": {"responses": {}}
            },
            "/v1/things/{id}": {"parameters": [{"name": "id", "in": "path"}, {"name": "v", "in": "query"}],
                                "delete": {"responses": {}}}
        }});
        let params = Params::of(&doc);
        assert!(params.refused(&Method::GET, "/v1/things", "limit=5").is_none());
        assert!(params.refused(&Method::HEAD, "/v1/things", "limit=5").is_none());
        let refused = params.refused(&Method::GET, "/v1/things", "limit=5&limt=6").unwrap();
        assert_eq!(refused.pointer, "/query/limt");
        assert!(refused.message.contains("it takes limit"), "{}", refused.message);
        // A header is not a query parameter; an operation without any takes none.
        assert_eq!(params.refused(&Method::GET, "/v1/things", "x-id=1").unwrap().pointer, "/query/x-id");
        let refused = params.refused(&Method::POST, "/v1/things", "a%2Fb~=1").unwrap();
        assert_eq!(refused.pointer, "/query/a~1b~0");
        assert!(refused.message.contains("it takes none"), "{}", refused.message);
        assert_eq!(params.refused(&Method::GET, "/v1/things", "=1").unwrap().pointer, "/query");
        // Parameters of the path apply to its every operation.
        assert!(params.refused(&Method::DELETE, "/v1/things/{id}", "v=1").is_none());
        // What the document does not describe is left alone.
        assert!(params.refused(&Method::GET, "/metrics", "anything=1").is_none());
        assert!(params.refused(&Method::PUT, "/v1/things", "anything=1").is_none());
    }
}
