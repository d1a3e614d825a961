//! Provider accounts: how a tenant reaches an external capacity API.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::id::ProviderAccountId;

use super::consistency::MinPosition;
use super::error::CommonErrors;
use super::fleet::ReadParams;
use super::request::{Authed, JsonBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::ProviderAccountPage;
use crate::wire::providers::{CredentialBody, ProviderAccountBody, ProviderAccountDto};

/// `POST /v1/provider-accounts`.
#[utoipa::path(
    post,
    path = "/v1/provider-accounts",
    tag = "providers",
    summary = "Create a provider account",
    description = "The credential is sealed with the PKI bundle's key in the same transaction and never shown again; \
                   a control plane without a bundle refuses (409). A `provider` pool names the account in \
                   `providerAccountId`.",
    request_body = ProviderAccountBody,
    responses(CommonErrors, (status = 201, description = "Created; `X-Position` is its consistency token", body = ProviderAccountDto)),
    security(("bearer" = [])),
)]
pub async fn create_provider_account(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<ProviderAccountBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "provider_accounts.create", Subject::OwnTenant).await?;
    let (spec, credential) = body.spec()?;
    let done = state.app.create_provider_account(&caller, spec, &credential).await?;
    let location = format!("/v1/provider-accounts/{}", done.value.id);
    Ok(committed_answer(StatusCode::CREATED, ProviderAccountDto::from(&done.value), done.position, Some(location)))
}

/// `GET /v1/provider-accounts`.
#[utoipa::path(
    get,
    path = "/v1/provider-accounts",
    tag = "providers",
    summary = "The caller's tenant's provider accounts, by name",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ProviderAccountPage)),
    security(("bearer" = [])),
)]
pub async fn list_provider_accounts(
    State(state): State<AppState>,
    who: Authed,
    // Accounts are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<ProviderAccountPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "provider_accounts.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_provider_accounts(&caller, &page).await?;
    Ok(Json(ProviderAccountPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/provider-accounts/{account_id}`.
#[utoipa::path(
    get,
    path = "/v1/provider-accounts/{account_id}",
    tag = "providers",
    summary = "One provider account (never its credential)",
    params(("account_id" = String, Path, description = "The account's id"), ReadParams),
    responses(CommonErrors, (status = 200, description = "The account", body = ProviderAccountDto)),
    security(("bearer" = [])),
)]
pub async fn get_provider_account(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<ProviderAccountDto>, ApiError> {
    let id: ProviderAccountId = path_id("accountId", &id)?;
    state.app.authorize(&who.0, "provider_accounts.get", Subject::ProviderAccount(&id)).await?;
    Ok(Json((&state.app.provider_account(&id).await?).into()))
}

/// `POST /v1/provider-accounts/{account_id}/credential`.
#[utoipa::path(
    post,
    path = "/v1/provider-accounts/{account_id}/credential",
    tag = "providers",
    summary = "Replace a provider account's credential",
    params(("account_id" = String, Path, description = "The account's id")),
    request_body = CredentialBody,
    responses(CommonErrors, (status = 200, description = "Replaced", body = ProviderAccountDto)),
    security(("bearer" = [])),
)]
pub async fn rotate_provider_credential(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CredentialBody>,
) -> Result<Response, ApiError> {
    let id: ProviderAccountId = path_id("accountId", &id)?;
    let caller =
        state.app.authorize(&who.0, "provider_accounts.credential.rotate", Subject::ProviderAccount(&id)).await?;
    let done = state.app.rotate_provider_credential(&caller, &id, &body.credential).await?;
    Ok(committed_answer(StatusCode::OK, ProviderAccountDto::from(&done.value), done.position, None))
}

/// `DELETE /v1/provider-accounts/{account_id}`.
#[utoipa::path(
    delete,
    path = "/v1/provider-accounts/{account_id}",
    tag = "providers",
    summary = "Delete a provider account and its credential (refused while a pool names it)",
    params(("account_id" = String, Path, description = "The account's id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = crate::wire::CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_provider_account(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: ProviderAccountId = path_id("accountId", &id)?;
    let caller = state.app.authorize(&who.0, "provider_accounts.delete", Subject::ProviderAccount(&id)).await?;
    let done = state.app.delete_provider_account(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, crate::wire::CreatedDto { id: id.to_string() }, done.position, None))
}
