"""The broker's users: the internal database opened and the configured users applied, the
auth backend chain and the authenticator built from the configuration.

At start the stored users (``users.json`` in the data directory) are loaded, then the
``[[users]]`` of the configuration applied as RabbitMQ applies ``load_definitions``: created or
overwritten (password, tags and the permissions they list). The default user (guest) is created
only on a first start (no users stored yet), as RabbitMQ's ``default_user``: deleting it at
runtime lasts; it gets ``.*`` permissions on every vhost of the ``vhosts`` setting.
"""

from __future__ import annotations

from ..auth import (
    AuthConfigError,
    Authenticator,
    InternalBackend,
    Permission,
    User,
    UserDb,
    UserDbError,
    load_chain,
)
from ..config import DEFAULT_USERS, BrokerConfig, PermissionConfig, UserConfig
from ..storage_env import StorageEnv
from .definitions import StartupError


def user_from_config(entry: UserConfig) -> User:
    """The user a ``[[users]]`` entry describes (a plain-text password hashed here, and its
    SCRAM credentials made)."""
    if entry.password is not None:
        return User.with_password(entry.name, entry.password, entry.tags, entry.hashing_algorithm)
    password_hash = entry.password_hash or ""
    return User(entry.name, password_hash, entry.hashing_algorithm, frozenset(entry.tags))


def open_user_db(config: BrokerConfig, env: StorageEnv) -> tuple[UserDb, bool]:
    """The stored users with the configured ones applied (StartupError for a bad store), and
    whether this is the user database's first start (nothing stored yet)."""
    db = UserDb(env)
    try:
        stored = db.load(config.data_dir)
    except (OSError, UserDbError) as exc:
        raise StartupError(f"cannot load the users: {exc}") from None
    if stored and config.users == DEFAULT_USERS:
        return db, False
    for entry in config.users:
        db.put_user(user_from_config(entry))
        permissions = dict(entry.permissions)
        if config.users == DEFAULT_USERS:  # the default user may use every configured vhost
            permissions.update({v: PermissionConfig() for v in config.vhosts})
        for vhost, p in permissions.items():
            db.set_permissions(entry.name, vhost, Permission(p.configure, p.write, p.read))
    return db, not stored


def grant_default_user(db: UserDb, config: BrokerConfig, vhosts: list[str]) -> None:
    """On the user database's first start with the default user: ``.*`` for it on every vhost
    restored from the data directory (a data directory of a tqbroker before users had
    permissions, where the default user could use every vhost)."""
    if config.users != DEFAULT_USERS:
        return
    for entry in config.users:
        for vhost in vhosts:
            if db.permission(entry.name, vhost) is None:
                db.set_permissions(entry.name, vhost, Permission())


def build_authenticator(config: BrokerConfig, db: UserDb) -> Authenticator:
    """The chain of ``auth_backends`` (``internal`` is ``db``'s backend) and its authenticator
    (StartupError naming an unknown or failing backend)."""
    try:
        chain = load_chain(
            config.auth_backends, config.auth_backend_options, {"internal": InternalBackend(db)}
        )
    except AuthConfigError as exc:
        raise StartupError(str(exc)) from None
    return Authenticator(
        chain,
        loopback_users=config.loopback_users,
        failure_delay=config.auth_failure_delay,
        failure_burst=config.auth_failure_burst,
        failure_rate=config.auth_failure_rate,
    )
