//! Webhook subscriptions: a tenant's events POSTed, signed, to a URL of its own (delivered by
//! [`crate::webhooks`]).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::id::WebhookId;

use super::consistency::MinPosition;
use super::error::CommonErrors;
use super::request::{Authed, JsonBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::WebhookPage;
use crate::wire::webhooks::{WebhookBody, WebhookCreatedDto, WebhookDeliveriesDto, WebhookDto, WebhookReplayDto};

/// `POST /v1/webhooks`.
#[utoipa::path(
    post,
    path = "/v1/webhooks",
    tag = "webhooks",
    summary = "Subscribe a URL to events of the caller's tenant",
    description = "Each event of the listed types that the caller's tenant may see (as on `GET /v1/events`) and that \
                   commits after the subscription is POSTed to the URL as the stream shows it, in log order, signed \
                   the Standard Webhooks way (`webhook-id`, `webhook-timestamp`, `webhook-signature`). The signing \
                   secret is answered here once, sealed with the PKI bundle's key; a control plane without a bundle \
                   refuses (409).",
    request_body = WebhookBody,
    responses(CommonErrors, (status = 201, description = "Created, with its secret; `X-Position` is its consistency token", body = WebhookCreatedDto)),
    security(("bearer" = [])),
)]
pub async fn create_webhook(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<WebhookBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "webhooks.create", Subject::OwnTenant).await?;
    let done = state.app.create_webhook(&caller, body.spec()).await?;
    let location = format!("/v1/webhooks/{}", done.value.webhook.id);
    Ok(committed_answer(StatusCode::CREATED, WebhookCreatedDto::from(&done.value), done.position, Some(location)))
}

/// `GET /v1/webhooks`.
#[utoipa::path(
    get,
    path = "/v1/webhooks",
    tag = "webhooks",
    summary = "The caller's tenant's webhook subscriptions, by id",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = WebhookPage)),
    security(("bearer" = [])),
)]
pub async fn list_webhooks(
    State(state): State<AppState>,
    who: Authed,
    // Subscriptions are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<WebhookPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "webhooks.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_webhooks(&caller, &page).await?;
    Ok(Json(WebhookPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/webhooks/{webhook_id}`.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{webhook_id}",
    tag = "webhooks",
    summary = "One webhook subscription (never its secret)",
    params(("webhook_id" = String, Path, description = "The subscription's id")),
    responses(CommonErrors, (status = 200, description = "The subscription", body = WebhookDto)),
    security(("bearer" = [])),
)]
pub async fn get_webhook(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
) -> Result<Json<WebhookDto>, ApiError> {
    let id: WebhookId = path_id("webhookId", &id)?;
    let caller = state.app.authorize(&who.0, "webhooks.get", Subject::OwnTenant).await?;
    Ok(Json((&state.app.webhook(&caller, &id).await?).into()))
}

/// `DELETE /v1/webhooks/{webhook_id}`.
#[utoipa::path(
    delete,
    path = "/v1/webhooks/{webhook_id}",
    tag = "webhooks",
    summary = "Delete a webhook subscription, its secret and its deliveries' records",
    params(("webhook_id" = String, Path, description = "The subscription's id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = crate::wire::CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_webhook(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: WebhookId = path_id("webhookId", &id)?;
    let caller = state.app.authorize(&who.0, "webhooks.delete", Subject::OwnTenant).await?;
    let done = state.app.delete_webhook(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, crate::wire::CreatedDto { id: id.to_string() }, done.position, None))
}

/// `POST /v1/webhooks/{webhook_id}/rotate-secret`.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{webhook_id}/rotate-secret",
    tag = "webhooks",
    summary = "Replace a subscription's signing secret (answered once); deliveries are signed with the new one from now on",
    params(("webhook_id" = String, Path, description = "The subscription's id")),
    responses(CommonErrors, (status = 200, description = "Replaced, with the new secret", body = WebhookCreatedDto)),
    security(("bearer" = [])),
)]
pub async fn rotate_webhook_secret(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: WebhookId = path_id("webhookId", &id)?;
    let caller = state.app.authorize(&who.0, "webhooks.secret.rotate", Subject::OwnTenant).await?;
    let done = state.app.rotate_webhook_secret(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, WebhookCreatedDto::from(&done.value), done.position, None))
}

/// `GET /v1/webhooks/{webhook_id}/deliveries`.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{webhook_id}/deliveries",
    tag = "webhooks",
    summary = "A subscription's recent delivery attempts (newest first) and its dead letters",
    params(("webhook_id" = String, Path, description = "The subscription's id")),
    responses(CommonErrors, (status = 200, description = "Attempts and dead letters", body = WebhookDeliveriesDto)),
    security(("bearer" = [])),
)]
pub async fn webhook_deliveries(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<WebhookDeliveriesDto>, ApiError> {
    let id: WebhookId = path_id("webhookId", &id)?;
    let caller = state.app.authorize(&who.0, "webhooks.deliveries.list", Subject::OwnTenant).await?;
    Ok(Json((&state.app.webhook_deliveries(&caller, &id).await?).into()))
}

/// `POST /v1/webhooks/{webhook_id}/dead-letters/replay`.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{webhook_id}/dead-letters/replay",
    tag = "webhooks",
    summary = "Queue a subscription's dead letters for delivery again, oldest first, before its next events",
    params(("webhook_id" = String, Path, description = "The subscription's id")),
    responses(CommonErrors, (status = 200, description = "How many were queued", body = WebhookReplayDto)),
    security(("bearer" = [])),
)]
pub async fn replay_webhook_dead_letters(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: WebhookId = path_id("webhookId", &id)?;
    let caller = state.app.authorize(&who.0, "webhooks.dead_letters.replay", Subject::OwnTenant).await?;
    let done = state.app.replay_webhook_dead_letters(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, WebhookReplayDto { queued: done.value }, done.position, None))
}
