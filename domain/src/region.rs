//! A site's `iamRegion`: a region name in Better IAM's grammar, validated once when parsed.
//!
//! The grammar is Better IAM's `^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`: 1 to 63 lower-case letters, digits and
//! hyphens, starting and ending with a letter or digit. It is checked by hand, so the error can say which rule
//! the input broke.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest region name Better IAM accepts.
pub const MAX_REGION_LEN: usize = 63;

/// A valid region name, such as `us-east-1`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IamRegion(String);

/// Why a string is not a region name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid iamRegion {input:?}: {reason}; a region is 1 to 63 lower-case letters, digits and hyphens, starting \
     and ending with a letter or digit, such as us-east-1"
)]
pub struct InvalidRegion {
    pub input: String,
    pub reason: &'static str,
}

impl IamRegion {
    /// The region name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for IamRegion {
    type Err = InvalidRegion;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        match problem(input) {
            None => Ok(Self(input.to_owned())),
            Some(reason) => Err(InvalidRegion { input: input.to_owned(), reason }),
        }
    }
}

impl TryFrom<String> for IamRegion {
    type Error = InvalidRegion;

    fn try_from(input: String) -> Result<Self, Self::Error> {
        match problem(&input) {
            None => Ok(Self(input)),
            Some(reason) => Err(InvalidRegion { input, reason }),
        }
    }
}

impl From<IamRegion> for String {
    fn from(region: IamRegion) -> Self {
        region.0
    }
}

impl AsRef<str> for IamRegion {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IamRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The first rule the input breaks, or `None` when it is a region name.
fn problem(input: &str) -> Option<&'static str> {
    if input.is_empty() {
        return Some("it is empty");
    }
    // The first bad character decides the message, so that "US East" is told about upper case first.
    for c in input.chars() {
        let reason = match c {
            'a'..='z' | '0'..='9' | '-' => continue,
            'A'..='Z' => "upper-case letters are not allowed",
            '_' => "underscores are not allowed",
            '.' => "dots are not allowed",
            c if c.is_whitespace() => "spaces are not allowed",
            c if !c.is_ascii() => "non-ASCII characters are not allowed",
            _ => "only lower-case letters, digits and hyphens are allowed",
        };
        return Some(reason);
    }
    if input.starts_with('-') {
        return Some("it starts with a hyphen");
    }
    if input.ends_with('-') {
        return Some("it ends with a hyphen");
    }
    // Every character is ASCII by now, so the byte length is the character count.
    if input.len() > MAX_REGION_LEN {
        return Some("it is longer than 63 characters");
    }
    None
}

#[cfg(test)]
mod tests;
