//! The schema names of a collection name and a document id, for types
//! below the HTTP layer that the API description shows (a committed
//! transaction's results): named in `value_type = ...` only, their schemas
//! are written by `http::contract`, as its own placeholders' are.

/// A collection name.
#[allow(dead_code, reason = "named in `value_type = ...` only")]
pub(crate) struct Collection;

/// A document id.
#[allow(dead_code, reason = "named in `value_type = ...` only")]
pub(crate) struct DocumentId;

/// The names of the schemas this module stands for.
pub(crate) const NAMES: &[&str] = &["Collection", "DocumentId"];

/// A schema whose content `http::contract` writes: an empty object to
/// utoipa, under the type's own name (used there too).
macro_rules! placeholder_schema {
    ($($name:ident),*) => {
        $(
            impl ::utoipa::PartialSchema for $name {
                fn schema() -> ::utoipa::openapi::RefOr<::utoipa::openapi::Schema> {
                    ::utoipa::openapi::ObjectBuilder::new().build().into()
                }
            }

            impl ::utoipa::ToSchema for $name {
                fn name() -> ::std::borrow::Cow<'static, str> {
                    ::std::borrow::Cow::Borrowed(stringify!($name))
                }
            }
        )*
    };
}
pub(crate) use placeholder_schema;

placeholder_schema!(Collection, DocumentId);
