//! Machines from their BMC: enrolment (the node in `enrolling`, its BMC and driver bindings recorded, its
//! credentials sealed), moves of the lifecycle (`provisionState`), and the lifecycle controller that fails a
//! node stuck in a transitional state (a work item per node, due when the state's limit ends).

use bc_domain::Rejection;
use bc_domain::id::{NodeId, PoolId, TenantId};
use bc_domain::node::lifecycle::{self, enrolled_bmc};
use bc_domain::node::{Adapter, Connectivity, Node, NodeBmc, NodeEvent, NodeRegistered, ProvisionState, Role, Trust};
use bc_domain::site::check_name;
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::lease::Lease;
use bc_eventstore::queue::{self, WorkItem};
use bc_eventstore::{Position, ScopedFutureExt as _, Tx, TxOptions, clock};

use crate::fleet::owned_pool;
use crate::store::{self, NamedTable};
use crate::work::{self, WorkKey, fenced};
use crate::{App, AppResult, Caller, Committed, record, record_node};

/// The kind of the sealed secret that holds a BMC's credentials.
pub const BMC_CREDENTIALS: &str = "bmc-credentials";

/// The longest BMC user name or password.
pub const MAX_CREDENTIAL_CHARS: usize = 128;

/// `nodes.enrol`: a machine known by its BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrolNode {
    pub pool_id: PoolId,
    pub name: String,
    /// The BMC, with the driver of each concern (see [`lifecycle::default_drivers`]).
    pub bmc: NodeBmc,
    pub username: String,
    pub password: String,
}

/// A BMC's credentials as they are sealed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BmcCredentials {
    pub username: String,
    pub password: String,
}

fn credentials_of(bytes: &[u8]) -> AppResult<BmcCredentials> {
    serde_json::from_slice(bytes).map_err(|err| store::corrupt("BMC credentials", err))
}

fn check_credential(field: &str, text: &str) -> Result<(), Rejection> {
    if text.is_empty() || text.chars().count() > MAX_CREDENTIAL_CHARS || text.chars().any(char::is_control) {
        return Err(Rejection::invalid(
            field,
            format!("1 to {MAX_CREDENTIAL_CHARS} characters, no control characters"),
        ));
    }
    Ok(())
}

/// Records moves of a node's lifecycle (`node` as it was before them) with what every move brings: the
/// controller's next look at the new state's limit, and, when the node stops or starts being schedulable, its
/// future bookings moved elsewhere or its pool's pending reservations tried again. Every path that moves the
/// lifecycle (operators, workflows, the controller) records through here.
pub(crate) async fn record_moves(
    tx: &mut Tx,
    caller: &Caller,
    node: &Node,
    owner: &TenantId,
    events: Vec<NodeEvent>,
) -> AppResult<Option<Position>> {
    if events.is_empty() {
        return Ok(None);
    }
    let after = events.iter().fold(Some(node.clone()), bc_domain::node::evolve);
    let position = record_node(tx, caller, &node.id, owner, events).await?;
    let Some(after) = after else { return Ok(position) };
    if let Some(at) = lifecycle::next_look(&after) {
        work::wake_at(tx, &WorkKey::NodeLifecycle(node.id.clone()), at).await?;
    }
    let (was, is) = (node.provision_state.schedulable(), after.provision_state.schedulable());
    if was && !is {
        work::wake_now(tx, &WorkKey::NodeReplace(node.id.clone())).await?;
    }
    if is && !was {
        work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
    }
    Ok(position)
}

impl App {
    /// Enrols a machine by its BMC into a pool the caller's tenant owns: the node starts in `enrolling`, with no
    /// devices until it is inspected; the credentials are sealed with the PKI bundle's key in the same
    /// transaction, and never appear in an event.
    pub async fn enrol_node(&self, caller: &Caller, input: EnrolNode) -> AppResult<Committed<NodeId>> {
        check_name("name", &input.name)?;
        lifecycle::check_bmc(&input.bmc)?;
        check_credential("bmc.username", &input.username)?;
        check_credential("bmc.password", &input.password)?;
        let node_id = NodeId::generate();
        let credentials = BmcCredentials { username: input.username.clone(), password: input.password.clone() };
        let secret = serde_json::to_vec(&credentials).map_err(|err| store::corrupt("BMC credentials", err))?;
        let sealed = self
            .sealer()?
            .seal(&secret, &crate::sealed::secret_context(BMC_CREDENTIALS, node_id.as_str()))
            .map_err(crate::sealed::pki_failure)?;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (input, node_id, sealed) = (&input, &node_id, &sealed);
                async move {
                    let pool = owned_pool(tx, caller, &input.pool_id).await?;
                    if store::name_taken(tx, NamedTable::Nodes, input.pool_id.as_str(), &input.name).await? {
                        return Err(Rejection::Conflict(format!(
                            "a node named {:?} is already in the pool",
                            input.name
                        ))
                        .into());
                    }
                    if let Some(mac) = &input.bmc.boot_mac
                        && let Some(holder) = store::site::boot_mac_holder(tx, mac).await?
                    {
                        return Err(Rejection::Conflict(format!("node {holder} already boots with MAC {mac}")).into());
                    }
                    let site_id = store::pool_site(tx, &input.pool_id).await?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let registered = NodeEvent::Registered(NodeRegistered {
                        node_id: node_id.clone(),
                        pool_id: input.pool_id.clone(),
                        site_id,
                        name: input.name.clone(),
                        role: Role::Host,
                        trust: Trust::Platform,
                        owner_tenant_id: None,
                        adapter: Adapter::BcdV1,
                        provision_state: ProvisionState::Enrolling,
                        // No agent runs on it until it is deployed.
                        connectivity: Connectivity::Disconnected,
                        generation: 1,
                        observed_generation: 0,
                        gpus: Vec::new(),
                        devices: Vec::new(),
                        conditions: Vec::new(),
                        at_ms,
                    });
                    let bmc = enrolled_bmc(node_id, input.bmc.clone(), at_ms)?;
                    let stream = node_id.as_str();
                    let position = record(
                        tx,
                        caller,
                        stream,
                        &pool.owner_tenant_id,
                        ExpectedVersion::NO_STREAM,
                        vec![registered, bmc],
                    )
                    .await?;
                    store::certificates::put_secret(tx, BMC_CREDENTIALS, stream, sealed).await?;
                    if let Some(limit) = ProvisionState::Enrolling.limit_ms() {
                        work::wake_at(tx, &WorkKey::NodeLifecycle(node_id.clone()), at_ms + limit).await?;
                    }
                    Ok(Committed { value: node_id.clone(), position })
                }
                .scope_boxed()
            })
            .await
            .map_err(|err: crate::AppError| {
                err.on_unique_violation(|| {
                    "another machine was enrolled with the same boot MAC at the same moment".into()
                })
            })
    }

    /// The BMC credentials of an enrolled node, opened (for the site agent's driver calls).
    pub async fn bmc_credentials(&self, node_id: &NodeId) -> AppResult<Option<BmcCredentials>> {
        let secret = self.open_secret(BMC_CREDENTIALS, node_id.as_str()).await?;
        secret.map(|bytes| credentials_of(&bytes)).transpose()
    }

    /// Opens BMC credentials sealed for `node_id`, read already (with the site's steps).
    pub(crate) fn open_bmc_credentials(&self, node_id: &NodeId, sealed: &[u8]) -> AppResult<BmcCredentials> {
        let context = crate::sealed::secret_context(BMC_CREDENTIALS, node_id.as_str());
        let opened = self.sealer()?.open(sealed, &context).map_err(crate::sealed::pki_failure)?;
        credentials_of(&opened)
    }

    /// Moves a node of a pool the caller's tenant owns to `to`, as its lifecycle allows; leaving a schedulable
    /// state moves its future bookings elsewhere, as maintenance does.
    pub async fn change_provision_state(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        to: ProvisionState,
        reason: Option<String>,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let reason = &reason;
                async move {
                    let not_found = || Rejection::NotFound { kind: "node", id: node_id.to_string() };
                    let Some((node, _)) = store::node_aggregate(tx, node_id).await? else {
                        return Err(not_found().into());
                    };
                    let pool = owned_pool(tx, caller, &node.pool_id).await.map_err(|_| not_found())?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = lifecycle::change_provision(&node, to, reason.clone(), now_ms)?;
                    let position = record_moves(tx, caller, &node, &pool.owner_tenant_id, events).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Records the machine's power as its BMC reported it (nothing when it is what the node already shows): the
    /// `power` axis is only ever what a BMC said.
    pub async fn observe_power(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        power: bc_domain::node::Power,
    ) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let Some((node, _)) = store::node_aggregate(tx, node_id).await? else { return Ok(()) };
                    if node.power == power || node.deleted_at_ms.is_some() {
                        return Ok(());
                    }
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let owner = store::pool_owner(tx, &node.pool_id).await?;
                    let event = NodeEvent::PowerObserved(bc_domain::node::NodePowerObserved {
                        node_id: node_id.clone(),
                        power,
                        at_ms,
                    });
                    record_node(tx, caller, node_id, &owner, vec![event]).await?;
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }

    /// The lifecycle controller's work item of one node: fails it when its transitional state outlasted its
    /// limit, or looks again when the limit ends.
    pub(crate) async fn run_lifecycle_item(
        &self,
        caller: &Caller,
        item: &WorkItem,
        node_id: &NodeId,
        fence: Option<&Lease>,
    ) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    fenced(tx, fence).await?;
                    let Some((node, _)) = store::node_aggregate(tx, node_id).await? else {
                        queue::complete(tx, item).await?;
                        return Ok(());
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = lifecycle::fail_if_stuck(&node, now_ms);
                    if !events.is_empty() {
                        let owner = store::pool_owner(tx, &node.pool_id).await?;
                        record_moves(tx, caller, &node, &owner, events).await?;
                        queue::complete(tx, item).await?;
                        return Ok(());
                    }
                    match lifecycle::next_look(&node) {
                        Some(at) if at > now_ms => queue::reschedule(tx, item, at).await?,
                        _ => queue::complete(tx, item).await?,
                    };
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }
}
