from sqlalchemy import UniqueConstraint

from service.models.base import Base
from service.models.versioned import NamedVersion


class VerifierVersion(NamedVersion, Base):
    """One immutable version of a named verifier; (tenant, name, version) is unique."""

    __tablename__ = "verifier_versions"
    __table_args__ = (UniqueConstraint("tenant_id", "name", "version", name="name_version"),)
