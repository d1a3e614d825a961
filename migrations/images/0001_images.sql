-- Images. `images` is the inline table of the image events (rebuilt from the log like the capacity tables). The
-- bytes are not in the log: an upload writes them to `image_chunks` under an upload of its own, in many short
-- transactions, and they become an image's content only when the command that records the image also records
-- `image_blobs`, the content-addressed index (one row per distinct SHA-256, naming the upload that holds the
-- bytes). Nothing reads chunks except through a blob, so a half-written or refused upload is never served; an
-- upload no blob names is removed when it fails, and by the worker's sweep when its writer died.
CREATE TABLE images (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    version text NOT NULL,
    format text NOT NULL CHECK (format IN ('raw', 'qcow2', 'iso')),
    sha256 text NOT NULL,
    size_bytes bigint NOT NULL CHECK (size_bytes > 0),
    visibility text NOT NULL CHECK (visibility IN ('private', 'public')),
    signer text,
    signature text,
    created_at timestamptz NOT NULL,
    UNIQUE (tenant_id, name, version)
);
CREATE INDEX images_sha256 ON images (sha256);
CREATE INDEX images_public ON images (name, version, id) WHERE visibility = 'public';

CREATE TABLE image_uploads (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    started_at timestamptz NOT NULL,
    -- The last chunk's arrival: the sweep removes an upload no blob names once this is old.
    touched_at timestamptz NOT NULL
);

CREATE TABLE image_chunks (
    upload_id text NOT NULL REFERENCES image_uploads (id) ON DELETE CASCADE,
    seq integer NOT NULL CHECK (seq >= 0),
    data bytea NOT NULL,
    PRIMARY KEY (upload_id, seq)
);
-- Images are mostly compressed or random bytes already: store the chunks out of line without trying to
-- compress them again.
ALTER TABLE image_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE image_blobs (
    sha256 text PRIMARY KEY,
    size_bytes bigint NOT NULL,
    upload_id text NOT NULL UNIQUE REFERENCES image_uploads (id),
    stored_at timestamptz NOT NULL
);
