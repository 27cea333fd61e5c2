//! The schema names of a collection name and a document id, for types
//! below the HTTP layer that the API description shows (a committed
//! transaction's results): named in `value_type = ...` only, their schemas
//! are written by `http::contract`, as its own placeholders' are.

use std::borrow::Cow;

use utoipa::openapi::{ObjectBuilder, RefOr, Schema};

/// A collection name.
#[allow(dead_code, reason = "named in `value_type = ...` only")]
pub(crate) struct Collection;

/// A document id.
#[allow(dead_code, reason = "named in `value_type = ...` only")]
pub(crate) struct DocumentId;

/// The names of the schemas this module stands for.
pub(crate) const NAMES: &[&str] = &["Collection", "DocumentId"];

macro_rules! named {
    ($($name:ident),*) => {
        $(
            impl utoipa::PartialSchema for $name {
                fn schema() -> RefOr<Schema> {
                    ObjectBuilder::new().build().into()
                }
            }

            impl utoipa::ToSchema for $name {
                fn name() -> Cow<'static, str> {
                    Cow::Borrowed(stringify!($name))
                }
            }
        )*
    };
}

named!(Collection, DocumentId);
