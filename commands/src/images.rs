//! Images: uploads streamed into a content-addressed store in PostgreSQL, checked against their declared SHA-256
//! and size while they arrive and against the signer allowlist before a byte is read; reads of the stored images
//! and their bytes; deletion, which frees the bytes once no image holds them.
//!
//! An upload writes 1 MiB chunks in short transactions of their own (an upload of gigabytes never holds a
//! transaction open, nor the log's horizon with it). The command that records the image also records the blob
//! (`sha256` → the upload holding its bytes), and only a blob's chunks are ever served: a refused, broken or
//! abandoned upload is never visible, and is removed when it fails or, if its process died, by the worker's
//! sweep ([`App::sweep_image_uploads`]).

use std::path::Path;

use bc_domain::Rejection;
use bc_domain::id::{ImageId, TenantId};
use bc_domain::image::{self, CreateImage, Created, Image, ImageCreated, ImageFormat, Signed, Visibility};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};
use ed25519_dalek::pkcs8::DecodePublicKey as _;
use ed25519_dalek::{Signature, VerifyingKey};
use futures_util::{Stream, StreamExt as _};
use sha2::{Digest as _, Sha256};

use crate::store::{self, images::ImageRow};
use crate::{App, AppResult, Caller, Committed, record};

/// The size of the chunks an upload is stored in.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The largest image a control plane takes unless configured otherwise (64 GiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 64 << 30;

/// How long an upload may go without a chunk before the sweep removes it.
pub const ABANDONED_UPLOAD_MS: i64 = 15 * 60 * 1000;

/// The signers whose Ed25519 signatures make an image `verified`.
#[derive(Clone, Default)]
pub struct ImageSigners {
    signers: Vec<(String, VerifyingKey)>,
}

impl std::fmt::Debug for ImageSigners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.signers.iter().map(|(name, _)| name)).finish()
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SignersFile {
    #[serde(default)]
    signer: Vec<SignerEntry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct SignerEntry {
    name: String,
    /// The public key as a PEM `PUBLIC KEY` (SubjectPublicKeyInfo), as `openssl pkey -pubout` writes it.
    public_key: String,
}

impl ImageSigners {
    /// An allowlist naming nobody: every image is stored unverified, and a signature is refused.
    pub fn none() -> ImageSigners {
        ImageSigners::default()
    }

    /// The same allowlist with `name`'s key added.
    pub fn with(mut self, name: &str, key: VerifyingKey) -> ImageSigners {
        self.signers.push((name.to_owned(), key));
        self
    }

    /// Reads an allowlist file (TOML): `[[signer]]` tables of `name` and `public-key` (PEM).
    pub fn parse(text: &str) -> Result<ImageSigners, String> {
        let file: SignersFile = toml::from_str(text).map_err(|err| err.to_string())?;
        let mut signers = ImageSigners::none();
        for entry in file.signer {
            if entry.name.is_empty() || entry.name.len() > 64 || !entry.name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("signer {:?}: a name is 1 to 64 printable characters", entry.name));
            }
            if signers.signers.iter().any(|(name, _)| *name == entry.name) {
                return Err(format!("signer {:?} is named twice", entry.name));
            }
            let key = VerifyingKey::from_public_key_pem(entry.public_key.trim()).map_err(|err| {
                format!("signer {:?}: public-key is not an Ed25519 public key in PEM: {err}", entry.name)
            })?;
            signers = signers.with(&entry.name, key);
        }
        Ok(signers)
    }

    /// Reads the allowlist file at `path`.
    pub fn load(path: &Path) -> Result<ImageSigners, String> {
        let text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?;
        ImageSigners::parse(&text).map_err(|err| format!("{}: {err}", path.display()))
    }

    /// The signer names, in the file's order.
    pub fn names(&self) -> Vec<&str> {
        self.signers.iter().map(|(name, _)| name.as_str()).collect()
    }

    /// Checks `signature` (hex) over the 32-byte SHA-256 `digest`, by `signer` or, when none is named, by whoever
    /// in the allowlist made it: the signer's name.
    fn verify(&self, signer: Option<&str>, signature: &str, digest: &[u8; 32]) -> Result<String, Rejection> {
        let bytes: [u8; 64] = hex::decode(signature)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| Rejection::invalid("signature", "must be 128 hexadecimal digits (an Ed25519 signature)"))?;
        let signature = Signature::from_bytes(&bytes);
        let candidates: Vec<&(String, VerifyingKey)> = match signer {
            Some(name) => {
                let found = self.signers.iter().find(|(known, _)| known == name);
                vec![found.ok_or_else(|| {
                    Rejection::invalid("signer", format!("{name:?} is not in this control plane's image signers"))
                })?]
            }
            None => self.signers.iter().collect(),
        };
        candidates
            .into_iter()
            .find(|(_, key)| key.verify_strict(digest, &signature).is_ok())
            .map(|(name, _)| name.clone())
            .ok_or_else(|| {
                let by = signer.map_or_else(|| "any allowed signer".to_owned(), |name| format!("signer {name:?}"));
                Rejection::invalid("signature", format!("does not verify the image's SHA-256 as signed by {by}"))
            })
    }
}

/// How this control plane takes images.
#[derive(Debug, Clone)]
pub struct ImagePolicy {
    pub signers: ImageSigners,
    /// The largest image taken, in bytes.
    pub max_bytes: u64,
}

impl Default for ImagePolicy {
    fn default() -> Self {
        ImagePolicy { signers: ImageSigners::none(), max_bytes: DEFAULT_MAX_IMAGE_BYTES }
    }
}

/// `images.create`: what the upload says of the bytes that follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadImage {
    pub name: String,
    pub version: String,
    pub format: ImageFormat,
    pub visibility: Visibility,
    /// The SHA-256 the bytes must have (lower-case hex).
    pub sha256: String,
    /// The size the bytes must have, when the caller declares it (or the request's length says it).
    pub size_bytes: Option<u64>,
    pub signer: Option<String>,
    /// The detached Ed25519 signature over the 32-byte SHA-256, in hex.
    pub signature: Option<String>,
}

/// An image as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageView {
    pub id: ImageId,
    pub tenant_id: TenantId,
    pub name: String,
    pub version: String,
    pub format: ImageFormat,
    pub sha256: String,
    pub size_bytes: u64,
    pub visibility: Visibility,
    /// The allow-listed signer whose signature verified it; `None`: unverified.
    pub signer: Option<String>,
    pub created_at_ms: i64,
}

impl ImageView {
    pub fn verified(&self) -> bool {
        self.signer.is_some()
    }

    fn of_row(row: ImageRow) -> AppResult<ImageView> {
        let bad = |err: String| store::corrupt("an images row", err);
        Ok(ImageView {
            id: row.id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            tenant_id: row.tenant_id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            name: row.name,
            version: row.version,
            format: serde_json::from_value(serde_json::Value::String(row.format)).map_err(|e| bad(e.to_string()))?,
            sha256: row.sha256,
            size_bytes: u64::try_from(row.size_bytes).map_err(|e| bad(e.to_string()))?,
            visibility: serde_json::from_value(serde_json::Value::String(row.visibility))
                .map_err(|e| bad(e.to_string()))?,
            signer: row.signer,
            created_at_ms: row.created_at_ms,
        })
    }

    fn of_image(image: &Image) -> ImageView {
        let c = &image.created;
        ImageView {
            id: c.image_id.clone(),
            tenant_id: c.tenant_id.clone(),
            name: c.name.clone(),
            version: c.version.clone(),
            format: c.format,
            sha256: c.sha256.clone(),
            size_bytes: c.size_bytes,
            visibility: c.visibility,
            signer: c.signed.as_ref().map(|s| s.signer.clone()),
            created_at_ms: c.at_ms,
        }
    }
}

/// What an upload came to: the image, and whether this call stored it (`false`: the same upload was stored
/// before, and this is its retry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    pub image: ImageView,
    pub created: bool,
}

/// Where an image's bytes are, for reading them chunk by chunk ([`App::image_chunk`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageContent {
    pub image: ImageView,
    upload_id: String,
    pub chunks: i32,
}

impl App {
    /// The same application, taking images under `policy`.
    pub fn with_image_policy(mut self, policy: ImagePolicy) -> Self {
        self.images = std::sync::Arc::new(policy);
        self
    }

    /// Stores an image from `body`: the request is checked (fields, size, signature) before a byte is read, the
    /// bytes are hashed and counted as they arrive, and the image is recorded only if they match. Whatever
    /// fails, the bytes written are removed and nothing is recorded. The door decides who may upload, and who
    /// may publish a public image.
    pub async fn upload_image<S, B, E>(&self, caller: &Caller, input: UploadImage, body: S) -> AppResult<Uploaded>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        image::check_name(&input.name)?;
        image::check_version(&input.version)?;
        image::check_sha256("sha256", &input.sha256)?;
        let max = self.images.max_bytes;
        if let Some(size) = input.size_bytes {
            if size == 0 {
                return Err(Rejection::invalid("size", "an image holds at least one byte").into());
            }
            if size > max {
                return Err(Rejection::TooLarge {
                    field: "size".into(),
                    message: format!("{size} bytes is more than this control plane takes ({max})"),
                }
                .into());
            }
        }
        let digest: [u8; 32] = hex::decode(&input.sha256)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| Rejection::invalid("sha256", "must be 64 lower-case hexadecimal digits (a SHA-256)"))?;
        let signed = match (&input.signature, &input.signer) {
            (Some(signature), signer) => {
                let signer = self.images.signers.verify(signer.as_deref(), signature, &digest)?;
                Some(Signed { signer, signature: signature.to_ascii_lowercase() })
            }
            (None, Some(_)) => return Err(Rejection::invalid("signature", "a signer needs a signature").into()),
            (None, None) => None,
        };

        let upload_id = ulid::Ulid::new().to_string().to_ascii_lowercase();
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        store::images::begin_upload(&mut tx, &upload_id, caller.tenant_id.as_str()).await?;
        tx.commit().await?;
        let stored = self.receive_and_record(caller, &input, signed, &upload_id, max, body).await;
        // The upload stays only as a blob's bytes: refused, it goes now; stored under a blob another upload
        // already holds, it goes too.
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        store::images::remove_upload(&mut tx, &upload_id).await?;
        tx.commit().await?;
        stored
    }

    async fn receive_and_record<S, B, E>(
        &self,
        caller: &Caller,
        input: &UploadImage,
        signed: Option<Signed>,
        upload_id: &str,
        max: u64,
        body: S,
    ) -> AppResult<Uploaded>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let limit = input.size_bytes.unwrap_or(max);
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut buffer = Vec::with_capacity(CHUNK_BYTES);
        let mut seq = 0;
        let mut body = std::pin::pin!(body);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|err| Rejection::invalid("body", format!("the upload broke off: {err}")))?;
            let mut piece = piece.as_ref();
            received += piece.len() as u64;
            if received > limit {
                return Err(match input.size_bytes {
                    Some(size) => Rejection::invalid("body", format!("more bytes than the declared size ({size})")),
                    None => Rejection::TooLarge {
                        field: "body".into(),
                        message: format!("more than this control plane takes ({max} bytes)"),
                    },
                }
                .into());
            }
            hasher.update(piece);
            while !piece.is_empty() {
                let take = (CHUNK_BYTES - buffer.len()).min(piece.len());
                buffer.extend_from_slice(&piece[..take]);
                piece = &piece[take..];
                if buffer.len() == CHUNK_BYTES {
                    self.write_chunk(upload_id, seq, &buffer).await?;
                    seq += 1;
                    buffer.clear();
                }
            }
        }
        if !buffer.is_empty() {
            self.write_chunk(upload_id, seq, &buffer).await?;
        }
        if received == 0 {
            return Err(Rejection::invalid("body", "an image holds at least one byte").into());
        }
        if let Some(size) = input.size_bytes
            && received != size
        {
            return Err(Rejection::invalid("body", format!("{received} bytes arrived, not the declared {size}")).into());
        }
        let actual = hex::encode(hasher.finalize());
        if actual != input.sha256 {
            return Err(Rejection::invalid(
                "sha256",
                format!("the bytes that arrived have SHA-256 {actual}, not the declared {}", input.sha256),
            )
            .into());
        }
        self.record_image(caller, input, signed, upload_id, received).await
    }

    async fn write_chunk(&self, upload_id: &str, seq: i32, data: &[u8]) -> AppResult<()> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        store::images::write_chunk(&mut tx, upload_id, seq, data).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn record_image(
        &self,
        caller: &Caller,
        input: &UploadImage,
        signed: Option<Signed>,
        upload_id: &str,
        size_bytes: u64,
    ) -> AppResult<Uploaded> {
        let image_id = ImageId::generate();
        let size = i64::try_from(size_bytes).map_err(|_| Rejection::invalid("body", "too many bytes"))?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (image_id, signed) = (&image_id, &signed);
                async move {
                    let tenant = caller.tenant_id.as_str();
                    let existing = match store::images::image_named(tx, tenant, &input.name, &input.version).await? {
                        Some(id) => {
                            let id: ImageId = id.parse().map_err(|err| store::corrupt("an image id", err))?;
                            store::image_aggregate(tx, &id).await?.map(|(image, _)| image)
                        }
                        None => None,
                    };
                    let created = ImageCreated {
                        image_id: image_id.clone(),
                        tenant_id: caller.tenant_id.clone(),
                        name: input.name.clone(),
                        version: input.version.clone(),
                        format: input.format,
                        sha256: input.sha256.clone(),
                        size_bytes,
                        visibility: input.visibility,
                        signed: signed.clone(),
                        at_ms: clock::compute_now_ms(tx).await?,
                    };
                    match image::create_image(CreateImage { image: created, existing })? {
                        Created::Again(image) => Ok(Committed {
                            value: Uploaded { image: ImageView::of_image(&image), created: false },
                            position: None,
                        }),
                        Created::New(events) => {
                            store::images::store_blob(tx, &input.sha256, size, upload_id).await?;
                            let stream = image_id.as_str();
                            let image = events.iter().fold(None, image::evolve_image);
                            let image = image.ok_or_else(|| store::corrupt("an image just created", "no fold"))?;
                            let position =
                                record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, events)
                                    .await?;
                            Ok(Committed {
                                value: Uploaded { image: ImageView::of_image(&image), created: true },
                                position,
                            })
                        }
                    }
                }
                .scope_boxed()
            })
            .await;
        let name = format!("{}@{}", input.name, input.version);
        result.map(|committed| committed.value).map_err(|err: crate::AppError| {
            err.on_unique_violation(|| format!("image {name} is being uploaded by another request"))
        })
    }

    /// A page of the images the caller's tenant sees: its own and the public ones, by id.
    pub async fn list_images(
        &self,
        caller: &Caller,
        page: &crate::reads::Page,
    ) -> AppResult<crate::reads::Listed<ImageView>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows =
            store::images::list(&mut tx, caller.tenant_id.as_str(), page.after_key.as_deref(), page.limit + 1).await?;
        tx.commit().await?;
        let found =
            rows.into_iter().map(|row| Ok((row.id.clone(), ImageView::of_row(row)?))).collect::<AppResult<_>>()?;
        Ok(crate::reads::paged(found, page))
    }

    /// One image (the door has decided the caller may see it).
    pub async fn image(&self, id: &ImageId) -> AppResult<ImageView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::images::image(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        let row = row.ok_or_else(|| Rejection::NotFound { kind: "image", id: id.to_string() })?;
        ImageView::of_row(row)
    }

    /// Where an image's bytes are, to read them with [`App::image_chunk`].
    pub async fn image_content(&self, id: &ImageId) -> AppResult<ImageContent> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::images::image(&mut tx, id.as_str()).await?;
        let row = row.ok_or_else(|| Rejection::NotFound { kind: "image", id: id.to_string() })?;
        let blob = store::images::blob(&mut tx, &row.sha256).await?;
        tx.commit().await?;
        let (upload_id, size) = blob.ok_or_else(|| store::corrupt("an image's bytes", "no blob holds them"))?;
        let chunks = i32::try_from((size + CHUNK_BYTES as i64 - 1) / CHUNK_BYTES as i64)
            .map_err(|err| store::corrupt("a blob size", err))?;
        Ok(ImageContent { image: ImageView::of_row(row)?, upload_id, chunks })
    }

    /// Chunk `seq` of an image's bytes; an error when they went meanwhile (the image was deleted).
    pub async fn image_chunk(&self, content: &ImageContent, seq: i32) -> AppResult<Vec<u8>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let chunk = store::images::chunk(&mut tx, &content.upload_id, seq).await?;
        tx.commit().await?;
        chunk.ok_or_else(|| {
            Rejection::NotFound { kind: "image content", id: format!("{} (chunk {seq})", content.image.id) }.into()
        })
    }

    /// Deletes an image of the caller's tenant that no live profile deploys; its bytes go with it unless another
    /// image has the same. Serializable, with the profiles' creation: a profile created at the same moment either
    /// sees the image gone or makes this deletion see it.
    pub async fn delete_image(&self, caller: &Caller, id: &ImageId) -> AppResult<Committed<()>> {
        let (done, upload) = self
            .db
            .transaction_with_retry(TxOptions::COMMAND_SERIALIZABLE, &self.retry, |tx| {
                async move {
                    let (image, version) = match store::image_aggregate(tx, id).await? {
                        Some((image, version)) if image.created.tenant_id == caller.tenant_id => (Some(image), version),
                        _ => (None, 0),
                    };
                    if image.as_ref().is_some_and(|i| i.deleted_at_ms.is_none())
                        && let Some(profile) = store::profiles::profile_using_image(tx, id.as_str()).await?
                    {
                        return Err(Rejection::Conflict(format!(
                            "image {id} is deployed by profile {profile}: delete that profile version first"
                        ))
                        .into());
                    }
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = image::delete_image(image.as_ref(), id, now_ms)?;
                    let sha256 = image.map(|i| i.created.sha256).unwrap_or_default();
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    let upload = store::images::release_blob(tx, &sha256).await?;
                    Ok::<_, crate::AppError>((Committed { value: (), position }, upload))
                }
                .scope_boxed()
            })
            .await?;
        if let Some(upload) = upload {
            let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
            store::images::remove_upload(&mut tx, &upload).await?;
            tx.commit().await?;
        }
        Ok(done)
    }

    /// Removes uploads whose writer died: none of their chunks went into a blob and none arrived for
    /// [`ABANDONED_UPLOAD_MS`]. Returns how many.
    pub async fn sweep_image_uploads(&self) -> AppResult<u64> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let removed = store::images::sweep_uploads(&mut tx, ABANDONED_UPLOAD_MS).await?;
        tx.commit().await?;
        Ok(removed)
    }
}
