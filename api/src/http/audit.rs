//! `/v1/audit/checkpoints` and `/v1/audit/proof`: the tamper-evident audit trail's signed, chained checkpoints
//! and the inclusion proofs of its entries. A tenant sees its own; the platform's operators (`fleet.audit.list`)
//! any tenant's, as with the audit trail itself.

use axum::Json;
use axum::extract::{Path, State};
use bc_commands::audit::AuditScope;
use bc_commands::auth::ROOT_TENANT;
use bc_commands::door::Subject;
use bc_commands::{AppError, Caller};
use bc_domain::Rejection;
use bc_domain::id::TenantId;
use bc_eventstore::Position;
use serde::Deserialize;

use super::error::CommonErrors;
use super::request::{Authed, PageParams, QueryParams, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::CheckpointPage;
use crate::wire::audit::{AuditProofDto, CheckpointDto};

/// The query of `GET /v1/audit/checkpoints`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CheckpointListParams {
    /// Another tenant's checkpoints: for the root tenant's administrators.
    pub tenant: Option<String>,
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// The query of `GET /v1/audit/proof`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProofParams {
    /// The audit entry's position (`<epoch>-<txid>-<seq>`).
    pub position: Option<String>,
}

/// `GET /v1/audit/checkpoints`: a tenant's checkpoints, oldest first.
#[utoipa::path(
    get,
    path = "/v1/audit/checkpoints",
    tag = "audit",
    summary = "The caller's tenant's signed audit checkpoints, oldest first (another tenant's with ?tenant=, for the root tenant's administrators)",
    params(CheckpointListParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = CheckpointPage)),
    security(("bearer" = [])),
)]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    who: Authed,
    QueryParams(params): QueryParams<CheckpointListParams>,
) -> Result<Json<CheckpointPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "audit.checkpoints.list", Subject::OwnTenant).await?;
    let tenant = match params.tenant.as_deref() {
        None => caller.tenant_id.clone(),
        Some(text) => {
            let tenant: TenantId = path_id("tenant", text)?;
            if tenant != caller.tenant_id {
                state.app.authorize(&who.0, "fleet.audit.list", Subject::Fleet).await?;
            }
            tenant
        }
    };
    let page = PageParams { limit: params.limit, cursor: params.cursor, after: None }.page()?;
    let listed = state.app.audit_checkpoints(&tenant, &page).await?;
    Ok(Json(CheckpointPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/audit/checkpoints/{checkpoint_id}`: one checkpoint with its leaves.
#[utoipa::path(
    get,
    path = "/v1/audit/checkpoints/{checkpoint_id}",
    tag = "audit",
    summary = "One audit checkpoint with its leaves (each entry's position and leaf hash)",
    params(("checkpoint_id" = String, Path, description = "The checkpoint's id (`ckp_` and 32 hex digits)")),
    responses(CommonErrors, (status = 200, description = "The checkpoint", body = CheckpointDto)),
    security(("bearer" = [])),
)]
pub async fn get_checkpoint(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<CheckpointDto>, ApiError> {
    if !checkpoint_id_is_well_formed(&id) {
        return Err(ApiError::invalid_argument("checkpointId", "expected ckp_ and 32 lower-case hex digits"));
    }
    let caller = state.app.authorize(&who.0, "audit.checkpoints.get", Subject::OwnTenant).await?;
    let found = match state.app.audit_checkpoint(&caller, AuditScope::OwnTenant, &id).await {
        Err(err) if is_not_found(&err) && fleet_allowed(&state, &who, &caller).await => {
            state.app.audit_checkpoint(&caller, AuditScope::Fleet, &id).await
        }
        other => other,
    }?;
    Ok(Json((&found).into()))
}

/// `GET /v1/audit/proof?position=`: an entry, its checkpoint and its inclusion proof.
#[utoipa::path(
    get,
    path = "/v1/audit/proof",
    tag = "audit",
    summary = "An audit entry, the checkpoint that holds it and its inclusion proof (the audit path to the checkpoint's signed root)",
    params(ProofParams),
    responses(CommonErrors, (status = 200, description = "The entry and its proof", body = AuditProofDto)),
    security(("bearer" = [])),
)]
pub async fn get_proof(
    State(state): State<AppState>,
    who: Authed,
    QueryParams(params): QueryParams<ProofParams>,
) -> Result<Json<AuditProofDto>, ApiError> {
    let Some(text) = params.position.as_deref() else {
        return Err(ApiError::invalid_argument("position", "required: the audit entry's position"));
    };
    let position: Position = path_id("position", text)?;
    let caller = state.app.authorize(&who.0, "audit.proofs.get", Subject::OwnTenant).await?;
    let proof = match state.app.audit_proof(&caller, AuditScope::OwnTenant, &position).await {
        Err(err) if is_not_found(&err) && fleet_allowed(&state, &who, &caller).await => {
            state.app.audit_proof(&caller, AuditScope::Fleet, &position).await
        }
        other => other,
    }?;
    Ok(Json((&proof).into()))
}

fn checkpoint_id_is_well_formed(id: &str) -> bool {
    id.strip_prefix("ckp_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn is_not_found(err: &AppError) -> bool {
    matches!(err, AppError::Rejected(Rejection::NotFound { .. }))
}

/// Whether the caller, of the root tenant, may read every tenant's audit trail. Asked only after its own
/// tenant's answered not found, so a customer's read never asks (nor records a denial).
async fn fleet_allowed(state: &AppState, who: &Authed, caller: &Caller) -> bool {
    caller.tenant_id.as_str() == ROOT_TENANT
        && state.app.authorize(&who.0, "fleet.audit.list", Subject::Fleet).await.is_ok()
}
