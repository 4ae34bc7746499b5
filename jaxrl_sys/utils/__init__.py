"""Small shared helpers: strict config construction and the pytree fingerprint."""
from jaxrl_sys.utils.config import config_from_dict, config_to_dict, replace_config
from jaxrl_sys.utils.fingerprint import fingerprint

__all__ = ["config_from_dict", "config_to_dict", "fingerprint", "replace_config"]
