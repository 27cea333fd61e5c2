//! `GET /openapi.json?collections=a,b`: the API description with each
//! named collection's schemas as the type of its documents
//! (docs/guides/validation.md, "Typed clients"). The document operations
//! are repeated under each collection's own paths (`/v1/collections/orders/…`,
//! operation ids `v1.collections.orders.documents.*`), their `data`
//! typed by the collection's schema (`anyOf` its versions when it declares
//! several), so a generated client types `data` per collection. Asked
//! for as a read of those collections; without `collections` the
//! document is the committed one, open to anyone.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::AppState;
use super::auth::Access;
use super::error::ApiError;
use crate::document::rules::{Invalid, check_collection};
use crate::keys::Scope;

/// The most collections one request describes.
pub(crate) const MAX_COLLECTIONS: usize = 16;

/// The document operations repeated per collection: (templated path, the
/// collection's own path suffix).
const PATHS: &[(&str, &str)] = &[
    ("/v1/collections/{collection}/documents", "documents"),
    ("/v1/collections/{collection}/documents/{id}", "documents/{id}"),
    ("/v1/collections/{collection}/query", "query"),
];

/// The collections a `collections` parameter names, checked.
pub(crate) fn named(param: &str) -> Result<Vec<String>, ApiError> {
    let mut names: Vec<String> = Vec::new();
    for name in param.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        check_collection(name, "/query/collections")?;
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    if names.is_empty() {
        return Err(Invalid::new("/query/collections", "name at least one collection (a,b,…)").into());
    }
    if names.len() > MAX_COLLECTIONS {
        let why = format!("at most {MAX_COLLECTIONS} collections per description");
        return Err(Invalid::new("/query/collections", why).into());
    }
    Ok(names)
}

/// `base` (the committed description) with `names`' schemas, for a caller
/// with `access`.
pub(crate) async fn described(
    state: &AppState,
    access: &Access,
    base: &Value,
    names: &[String],
) -> Result<Value, ApiError> {
    for name in names {
        access.check(Scope::Read, name)?;
    }
    let mut doc = base.clone();
    for name in names {
        let known = state.documents.schemas().of(name).await?;
        let versions: Vec<Value> = known.versions.values().map(|d| (*d.schema).clone()).collect();
        add_collection(&mut doc, name, &versions);
    }
    Ok(doc)
}

/// A component name for collection `name`: `Orders`, `SalesOrders` (for
/// `sales_orders` or `sales-orders`), and a suffix when two collide.
fn type_name(name: &str, taken: &Map<String, Value>) -> String {
    let mut out = String::new();
    for part in name.split(['_', '-']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    let mut candidate = out.clone();
    let mut n = 2;
    while taken.contains_key(&candidate) || taken.contains_key(&format!("{candidate}Document")) {
        candidate = format!("{out}{n}");
        n += 1;
    }
    candidate
}

/// Add collection `name` to `doc`: its schemas (`versions`; none: any
/// object) as component `<Name>`, and the document operations under its
/// own paths with `data` of that type.
fn add_collection(doc: &mut Value, name: &str, versions: &[Value]) {
    let schemas = doc["components"]["schemas"].as_object().cloned().unwrap_or_default();
    let type_name = type_name(name, &schemas);
    let data_ref = format!("#/components/schemas/{type_name}");
    let mut defs = Vec::new();
    let data = match versions {
        [] => {
            json!({"type": "object", "description": format!("The fields of a document of {name} (no schema declared)")})
        }
        [one] => {
            let (schema, added) = embedded(one, &data_ref, &format!("{type_name}_"));
            defs.extend(added);
            schema
        }
        many => {
            let mut each = Vec::new();
            for (i, s) in many.iter().enumerate() {
                let (schema, added) = embedded(s, &format!("{data_ref}/anyOf/{i}"), &format!("{type_name}_{i}_"));
                defs.extend(added);
                each.push(schema);
            }
            json!({"anyOf": each})
        }
    };
    // The components that hold a document, retyped for this collection.
    let mut retyped: BTreeMap<String, String> = BTreeMap::new();
    for holder in ["DocumentOut", "QueryPageOut"] {
        retyped.insert(holder.to_owned(), format!("{type_name}{}", holder.trim_end_matches("Out")));
    }
    let components = doc["components"]["schemas"].as_object_mut().expect("components");
    let mut document = components.get("DocumentOut").cloned().unwrap_or_default();
    document["properties"]["data"] = json!({"$ref": data_ref});
    document["description"] = json!(format!("A document of {name}."));
    let mut page = components.get("QueryPageOut").cloned().unwrap_or_default();
    retarget(&mut page, &retyped);
    let new_document = json!({
        "allOf": [
            {"$ref": data_ref},
            {"type": "object", "properties": {"_id": {"$ref": "#/components/schemas/DocumentId"}}}
        ],
        "description": format!("A new document of {name}: its fields, with an optional `_id`."),
    });
    components.insert(type_name.clone(), data);
    components.extend(defs);
    components.insert(retyped["DocumentOut"].clone(), document);
    components.insert(retyped["QueryPageOut"].clone(), page);
    components.insert(format!("{type_name}New"), new_document);
    let paths = doc["paths"].as_object_mut().expect("paths");
    for (template, suffix) in PATHS {
        let Some(mut item) = paths.get(*template).cloned() else { continue };
        for (method, operation) in item.as_object_mut().into_iter().flatten() {
            let Some(op) = operation.as_object_mut() else { continue };
            if let Some(Value::String(id)) = op.get("operationId") {
                let action = id.rsplit('.').next().unwrap_or(id).to_owned();
                op.insert("operationId".into(), json!(format!("v1.collections.{name}.documents.{action}")));
            }
            op.insert("tags".into(), json!([name]));
            if let Some(Value::Array(params)) = op.get_mut("parameters") {
                params.retain(|p| p["name"] != "collection" || p["in"] != "path");
            }
            let body = op.get_mut("requestBody").and_then(|b| b.pointer_mut("/content/application~1json/schema"));
            if let Some(body) = body {
                match (method.as_str(), *suffix) {
                    ("post", "documents") => *body = json!({"$ref": format!("#/components/schemas/{type_name}New")}),
                    ("put", _) => *body = json!({"$ref": data_ref}),
                    _ => {}
                }
            }
            if let Some(responses) = op.get_mut("responses") {
                retarget(responses, &retyped);
            }
        }
        paths.insert(format!("/v1/collections/{name}/{suffix}"), item);
    }
}

/// `schema` as a component at `at`: its references within itself made
/// references within the component, its root `$defs` made components of
/// their own (`<prefix><name>`: generators read a component's `$defs` as
/// a property), and `$id` / `$schema` left out (the description's own
/// dialect is 2020-12). Answers the schema and the components it adds.
fn embedded(schema: &Value, at: &str, prefix: &str) -> (Value, Vec<(String, Value)>) {
    fn walk(value: &mut Value, at: &str, prefix: &str) {
        match value {
            Value::Object(members) => {
                if let Some(Value::String(target)) = members.get_mut("$ref")
                    && let Some(pointer) = target.strip_prefix('#')
                    && (pointer.is_empty() || pointer.starts_with('/'))
                {
                    let defined = ["/$defs/", "/definitions/"].iter().find_map(|d| pointer.strip_prefix(d));
                    *target = match defined {
                        Some(rest) => format!("#/components/schemas/{prefix}{rest}"),
                        None => format!("{at}{pointer}"),
                    };
                }
                for v in members.values_mut() {
                    walk(v, at, prefix);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, at, prefix)),
            _ => {}
        }
    }
    let mut out = schema.clone();
    let mut added = Vec::new();
    if let Value::Object(members) = &mut out {
        members.remove("$id");
        members.remove("$schema");
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = members.remove(key) {
                added.extend(defs.into_iter().map(|(name, def)| (format!("{prefix}{name}"), def)));
            }
        }
    }
    walk(&mut out, at, prefix);
    for (_, def) in &mut added {
        walk(def, at, prefix);
    }
    (out, added)
}

/// Every reference to a component of `retyped` in `value` made one to its
/// retyped copy.
fn retarget(value: &mut Value, retyped: &BTreeMap<String, String>) {
    match value {
        Value::Object(members) => {
            if let Some(Value::String(target)) = members.get_mut("$ref")
                && let Some(name) = target.strip_prefix("#/components/schemas/")
                && let Some(new) = retyped.get(name)
            {
                *target = format!("#/components/schemas/{new}");
            }
            for v in members.values_mut() {
                retarget(v, retyped);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| retarget(v, retyped)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collection_gets_its_typed_paths_and_components() {
        let mut doc: Value = serde_json::from_str(&crate::http::openapi_json()).expect("the description");
        let schema = json!({"type": "object", "$defs": {"line": {"type": "string"}}, "properties": {"total": {"type": "number"}, "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}}});
        add_collection(&mut doc, "sales_orders", &[schema]);
        let components = &doc["components"]["schemas"];
        assert_eq!(
            components["SalesOrders"]["properties"]["lines"]["items"]["$ref"],
            "#/components/schemas/SalesOrders_line"
        );
        assert_eq!(components["SalesOrders_line"]["type"], "string");
        assert!(components["SalesOrders"].get("$defs").is_none());
        assert_eq!(components["SalesOrdersDocument"]["properties"]["data"]["$ref"], "#/components/schemas/SalesOrders");
        let item = &doc["paths"]["/v1/collections/sales_orders/documents/{id}"];
        assert_eq!(item["get"]["operationId"], "v1.collections.sales_orders.documents.get");
        let ok = &item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(ok, "#/components/schemas/SalesOrdersDocument");
        assert!(item["get"]["parameters"].as_array().unwrap().iter().all(|p| p["name"] != "collection"));
        let create = &doc["paths"]["/v1/collections/sales_orders/documents"]["post"];
        assert_eq!(
            create["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/SalesOrdersNew"
        );
        let page = &components["SalesOrdersQueryPage"];
        assert!(page.to_string().contains("#/components/schemas/SalesOrdersDocument"), "{page}");
        // The templated operations are still there, untouched.
        let generic = &doc["paths"]["/v1/collections/{collection}/documents/{id}"]["get"];
        assert_eq!(
            generic["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/DocumentOut"
        );
    }

    #[test]
    fn names_are_checked_and_bounded() {
        assert_eq!(named("a, b,a").unwrap(), ["a", "b"]);
        assert!(named("").is_err() && named("_x").is_err());
        let many: Vec<String> = (0..17).map(|i| format!("c{i}")).collect();
        assert!(named(&many.join(",")).is_err());
    }
}
