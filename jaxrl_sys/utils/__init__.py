"""Small shared helpers: strict config construction and pytree utilities."""
from jaxrl_sys.utils.config import config_from_dict, config_to_dict, replace_config

__all__ = ["config_from_dict", "config_to_dict", "replace_config"]
