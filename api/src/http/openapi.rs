//! `GET /v1/openapi.json`: the OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use bc_domain::id::{
    CommandId, GrantId, IdentityId, ImageId, LimitId, NodeId, PoolId, ProfileId, ProjectId, ReservationId, SessionId,
    SiteId, TenantId, TokenId, WebhookId, WorkflowId,
};
use bc_eventstore::Position;
use utoipa::openapi::schema::{ArrayItems, Schema};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Content, RefOr};
use utoipa::{Modify, OpenApi};

use axum::routing::MethodFilter;
use std::sync::OnceLock;

use crate::wire::ops::OpenApiDto;

/// Bearer tokens, as the authorizer knows them.
pub struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        // Node agents authenticate with the credential their node got at join (`nc_...`), as a bearer token.
        components.add_security_scheme("node", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        // A ramdisk speaks with the session its boot credential claimed (`rds_...`).
        components.add_security_scheme("ramdisk", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The optional `Idempotency-Key` header of the create routes whose answers the idempotency layer keeps.
pub struct IdempotentCreates;

/// The handlers of those routes (the operation ids).
pub const IDEMPOTENT_CREATES: &[&str] = &[
    "create_site",
    "create_project",
    "create_pool",
    "register_node",
    "enrol_node",
    "create_workflow",
    "create_command",
    "create_join_token",
    "create_tenant",
    "create_identity",
    "create_grant",
    "create_limit",
    "create_profile",
    "create_provider_account",
    "create_flavor",
    "create_webhook",
];

impl Modify for IdempotentCreates {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        for item in openapi.paths.paths.values_mut() {
            let Some(post) = &mut item.post else { continue };
            if !post.operation_id.as_deref().is_some_and(|id| IDEMPOTENT_CREATES.contains(&id)) {
                continue;
            }
            let schema = utoipa::openapi::ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::Type::String)
                .min_length(Some(1))
                .max_length(Some(255));
            let parameter = ParameterBuilder::new()
                .name("Idempotency-Key")
                .parameter_in(ParameterIn::Header)
                .required(utoipa::openapi::Required::False)
                .description(Some(
                    "A retry with the same key, route and body is answered the first answer (with \
                     `Idempotent-Replayed: true`) without running again; another request with it is \
                     IDEMPOTENCY_KEY_REUSED. Kept a day.",
                ))
                .schema(Some(schema))
                .build();
            post.parameters.get_or_insert_with(Vec::new).push(RefOr::T(parameter));
        }
    }
}

/// The text form of ids and positions, wherever a parameter or a property carries one, as a `pattern`: clients
/// (and schema-driven fuzzers) learn what the server will parse, and every id in a response is checked against
/// it by schema validation.
pub struct TextPatterns;

/// The pattern of a parameter or property, by its name (the same name always carries the same kind of text).
fn pattern_of(name: &str) -> Option<&'static str> {
    Some(match name {
        "siteId" | "site_id" => SiteId::PATTERN,
        "poolId" | "pool_id" => PoolId::PATTERN,
        "nodeId" | "node_id" => NodeId::PATTERN,
        "projectId" | "project_id" => ProjectId::PATTERN,
        "commandId" | "command_id" => CommandId::PATTERN,
        "sessionId" | "session_id" => SessionId::PATTERN,
        "reservationId" | "reservation_id" => ReservationId::PATTERN,
        "tenantId" | "tenant_id" | "ownerTenantId" | "parentId" => TenantId::PATTERN,
        "identityId" | "identity_id" => IdentityId::PATTERN,
        "tokenId" | "token_id" => TokenId::PATTERN,
        "grantId" | "grant_id" => GrantId::PATTERN,
        "limitId" | "limit_id" => LimitId::PATTERN,
        "imageId" | "image_id" => ImageId::PATTERN,
        "profileId" | "profile_id" => ProfileId::PATTERN,
        "workflowId" | "workflow_id" => WorkflowId::PATTERN,
        "webhookId" | "webhook_id" => WebhookId::PATTERN,
        "after" | "X-Min-Position" | "Last-Event-ID" => Position::PATTERN,
        // URL-safe base64 without padding, as `encode_cursor` writes it.
        "cursor" | "nextCursor" => "^[A-Za-z0-9_-]+$",
        _ => return None,
    })
}

/// Sets the pattern of `schema`, a string (or nullable string), and of every property below it.
fn set_patterns(schema: &mut RefOr<Schema>, name: Option<&str>) {
    let RefOr::T(schema) = schema else { return };
    match schema {
        Schema::Object(object) => {
            if let Some(pattern) = name.and_then(pattern_of)
                && object.properties.is_empty()
            {
                object.pattern = Some(pattern.to_owned());
            }
            for (property, schema) in object.properties.iter_mut() {
                set_patterns(schema, Some(property));
            }
        }
        Schema::Array(array) => {
            if let ArrayItems::RefOrSchema(items) = &mut array.items {
                set_patterns(items, None);
            }
        }
        Schema::OneOf(one_of) => one_of.items.iter_mut().for_each(|s| set_patterns(s, name)),
        Schema::AllOf(all_of) => all_of.items.iter_mut().for_each(|s| set_patterns(s, name)),
        Schema::AnyOf(any_of) => any_of.items.iter_mut().for_each(|s| set_patterns(s, name)),
        _ => {}
    }
}

fn set_content_patterns<'a>(content: impl Iterator<Item = &'a mut RefOr<Content>>) {
    for content in content {
        if let RefOr::T(Content { schema: Some(schema), .. }) = content {
            set_patterns(schema, None);
        }
    }
}

impl Modify for TextPatterns {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for operation in operations.into_iter().flatten() {
                for parameter in operation.parameters.iter_mut().flatten() {
                    if let RefOr::T(parameter) = parameter
                        && let Some(schema) = &mut parameter.schema
                    {
                        set_patterns(schema, Some(&parameter.name));
                    }
                }
                if let Some(RefOr::T(body)) = &mut operation.request_body {
                    set_content_patterns(body.content.values_mut());
                }
                for response in operation.responses.responses.values_mut() {
                    if let RefOr::T(response) = response {
                        set_content_patterns(response.content.values_mut());
                    }
                }
            }
        }
        if let Some(components) = &mut openapi.components {
            for schema in components.schemas.values_mut() {
                set_patterns(schema, None);
            }
        }
    }
}

/// The document, made once per process from the route table's handlers.
pub fn document_once() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(super::ApiDoc::openapi)
}

/// The HTTP method and path of the operation `operation_id` (a handler's name) in `doc`: what its
/// `#[utoipa::path]` declares, the one place a route's method and path are written.
pub fn operation(doc: &utoipa::openapi::OpenApi, operation_id: &str) -> (MethodFilter, &'static str, String) {
    for (path, item) in &doc.paths.paths {
        let operations = [
            (MethodFilter::GET, "GET", &item.get),
            (MethodFilter::POST, "POST", &item.post),
            (MethodFilter::PUT, "PUT", &item.put),
            (MethodFilter::DELETE, "DELETE", &item.delete),
            (MethodFilter::PATCH, "PATCH", &item.patch),
        ];
        for (filter, http, operation) in operations {
            if operation.as_ref().and_then(|o| o.operation_id.as_deref()) == Some(operation_id) {
                return (filter, http, path.clone());
            }
        }
    }
    panic!("the route table names {operation_id}, which has no #[utoipa::path] operation")
}

/// The document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "health",
    summary = "This OpenAPI document",
    responses((status = 200, description = "The document", body = OpenApiDto))
)]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(document_once().clone())
}
