"""dcjax subpackage."""
