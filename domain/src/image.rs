//! Images: the disk and boot artifacts machines are deployed from. An image is named `name@version` in its
//! tenant, is immutable once stored, and is addressed by the SHA-256 of its bytes: two images with the same
//! bytes share one stored copy. It is `verified` when an allow-listed signer's Ed25519 signature over that
//! SHA-256 checked out at upload; an image uploaded without a signature is stored unverified, and one whose
//! signature does not check out is refused. Each image is a stream of its own (`img_...`).

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{ImageId, TenantId};

/// How an image's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageFormat {
    /// A whole disk, byte for byte.
    Raw,
    /// QEMU's copy-on-write format.
    Qcow2,
    /// An ISO 9660 image (installers, live systems).
    Iso,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Iso => "iso",
        }
    }
}

/// Who may see and deploy an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Visibility {
    /// Its tenant's only.
    Private,
    /// Every tenant's: published by the platform.
    Public,
}

impl Visibility {
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::Private => "private",
            Visibility::Public => "public",
        }
    }
}

/// The signer whose signature made an image `verified`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Signed {
    /// The signer's name in the allowlist.
    pub signer: String,
    /// The detached Ed25519 signature over the image's 32-byte SHA-256, in lower-case hex.
    pub signature: String,
}

/// An image as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageCreated {
    pub image_id: ImageId,
    pub tenant_id: TenantId,
    pub name: String,
    pub version: String,
    pub format: ImageFormat,
    /// The SHA-256 of its bytes, lower-case hex.
    pub sha256: String,
    pub size_bytes: u64,
    pub visibility: Visibility,
    /// The signature that verified it; `None` for an unverified image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<Signed>,
    pub at_ms: i64,
}

/// An image was deleted: its name and version are free again, and its bytes go once no other image has them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageDeleted {
    pub image_id: ImageId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of an image's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ImageEvent {
        Created(ImageCreated) = "image.created",
        Deleted(ImageDeleted) = "image.deleted",
    }
}

impl ImageEvent {
    pub fn image_id(&self) -> &ImageId {
        match self {
            ImageEvent::Created(e) => &e.image_id,
            ImageEvent::Deleted(e) => &e.image_id,
        }
    }
}

/// An image as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    #[serde(flatten)]
    pub created: ImageCreated,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

impl Image {
    pub fn verified(&self) -> bool {
        self.created.signed.is_some()
    }
}

pub fn evolve_image(state: Option<Image>, event: &ImageEvent) -> Option<Image> {
    match (state, event) {
        (None, ImageEvent::Created(e)) => Some(Image { created: e.clone(), deleted_at_ms: None }),
        (Some(image), ImageEvent::Deleted(e)) => Some(Image { deleted_at_ms: Some(e.at_ms), ..image }),
        (state, _) => state,
    }
}

/// The longest name or version.
pub const MAX_NAME_CHARS: usize = 64;

/// Checks a name: 1 to 64 of lower-case letters, digits, `.`, `_` and `-`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), Rejection> {
    let ok = name.len() <= MAX_NAME_CHARS
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Rejection::invalid(
            "name",
            "must be 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or a digit",
        ))
    }
}

/// Checks a version: 1 to 64 of letters, digits, `.`, `_`, `+` and `-`, starting with a letter or digit.
pub fn check_version(version: &str) -> Result<(), Rejection> {
    let ok = version.len() <= MAX_NAME_CHARS
        && version.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && version.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Rejection::invalid(
            "version",
            "must be 1 to 64 of letters, digits, '.', '_', '+' and '-', starting with a letter or a digit",
        ))
    }
}

/// Checks a SHA-256 as the API takes it: 64 lower-case hexadecimal digits.
pub fn check_sha256(field: &'static str, text: &str) -> Result<(), Rejection> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(Rejection::invalid(field, "must be 64 lower-case hexadecimal digits (a SHA-256)"))
    }
}

/// What `images.create` decides on, once the bytes have arrived and matched their declared hash and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateImage {
    pub image: ImageCreated,
    /// The live image of the same tenant, name and version, if there is one.
    pub existing: Option<Image>,
}

/// What a create comes to: a new image, or the same one again (a retry of an upload that was stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    New(Vec<ImageEvent>),
    Again(Box<Image>),
}

/// `images.create`: a name and version hold one content forever (until deleted); uploading the same bytes under
/// them again is answered the stored image, other bytes are a conflict.
pub fn create_image(command: CreateImage) -> Result<Created, Rejection> {
    let image = command.image;
    check_name(&image.name)?;
    check_version(&image.version)?;
    check_sha256("sha256", &image.sha256)?;
    if image.size_bytes == 0 {
        return Err(Rejection::invalid("size", "an image holds at least one byte"));
    }
    if let Some(existing) = command.existing {
        let same = existing.created.sha256 == image.sha256
            && existing.created.format == image.format
            && existing.created.visibility == image.visibility
            && existing.created.signed == image.signed;
        if same {
            return Ok(Created::Again(Box::new(existing)));
        }
        return Err(Rejection::Conflict(format!(
            "image {}@{} already exists ({}) with other content or settings; images are immutable, upload a new \
             version",
            image.name, image.version, existing.created.image_id
        )));
    }
    Ok(Created::New(vec![ImageEvent::Created(image)]))
}

/// `images.delete`: a live image of the caller's tenant.
pub fn delete_image(image: Option<&Image>, id: &ImageId, now_ms: i64) -> Result<Vec<ImageEvent>, Rejection> {
    image
        .filter(|i| i.deleted_at_ms.is_none())
        .ok_or_else(|| Rejection::NotFound { kind: "image", id: id.to_string() })?;
    Ok(vec![ImageEvent::Deleted(ImageDeleted { image_id: id.clone(), at_ms: now_ms })])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(sha: char) -> ImageCreated {
        ImageCreated {
            image_id: ImageId::generate(),
            tenant_id: "acme".parse().expect("tenant"),
            name: "ubuntu".into(),
            version: "24.04".into(),
            format: ImageFormat::Raw,
            sha256: sha.to_string().repeat(64),
            size_bytes: 10,
            visibility: Visibility::Private,
            signed: None,
            at_ms: 1,
        }
    }

    #[test]
    fn a_new_name_and_version_is_created() {
        let image = created('a');
        let made = create_image(CreateImage { image: image.clone(), existing: None }).expect("created");
        assert_eq!(made, Created::New(vec![ImageEvent::Created(image)]));
    }

    #[test]
    fn the_same_bytes_again_are_the_stored_image_and_other_bytes_a_conflict() {
        let stored = Image { created: created('a'), deleted_at_ms: None };
        let again = create_image(CreateImage { image: created('a'), existing: Some(stored.clone()) }).expect("again");
        assert_eq!(again, Created::Again(Box::new(stored.clone())));
        let other = create_image(CreateImage { image: created('b'), existing: Some(stored) }).expect_err("conflict");
        assert!(matches!(&other, Rejection::Conflict(m) if m.contains("ubuntu@24.04") && m.contains("immutable")));
    }

    #[test]
    fn names_versions_and_hashes_are_checked_naming_the_field() {
        for (name, version, sha, field) in [
            ("Ubuntu", "1", "a", "name"),
            ("", "1", "a", "name"),
            ("-x", "1", "a", "name"),
            ("x y", "1", "a", "name"),
            ("ubuntu", "", "a", "version"),
            ("ubuntu", "1 2", "a", "version"),
            ("ubuntu", "1", "A", "sha256"),
        ] {
            let mut image = created('a');
            image.name = name.into();
            image.version = version.into();
            image.sha256 = sha.repeat(64);
            let err = create_image(CreateImage { image, existing: None }).expect_err(name);
            assert!(matches!(&err, Rejection::InvalidArgument { field: f, .. } if f == field), "{name}: {err}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
        assert!(check_sha256("sha256", &"a".repeat(63)).is_err());
    }

    #[test]
    fn only_a_live_image_is_deleted() {
        let image = Image { created: created('a'), deleted_at_ms: None };
        let id = image.created.image_id.clone();
        let events = delete_image(Some(&image), &id, 5).expect("deleted");
        let gone = events.iter().fold(Some(image), evolve_image).expect("still folded");
        assert_eq!(gone.deleted_at_ms, Some(5));
        assert!(matches!(delete_image(Some(&gone), &id, 6), Err(Rejection::NotFound { kind: "image", .. })));
        assert!(matches!(delete_image(None, &id, 6), Err(Rejection::NotFound { .. })));
    }
}
