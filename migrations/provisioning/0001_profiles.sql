-- Profiles: the inline table of the profile events. A profile's name holds versions 1, 2, ... in its tenant; a
-- deleted version keeps its row (with `deleted_at`), so its number is never given again.
CREATE TABLE profiles (
    id text PRIMARY KEY,
    tenant_id text NOT NULL,
    name text NOT NULL,
    version integer NOT NULL CHECK (version > 0),
    target text NOT NULL CHECK (target IN ('metal', 'vps')),
    image_id text,
    spec jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    deleted_at timestamptz,
    UNIQUE (tenant_id, name, version)
);
CREATE INDEX profiles_image ON profiles (image_id) WHERE image_id IS NOT NULL AND deleted_at IS NULL;
