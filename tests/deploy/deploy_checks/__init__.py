"""The checks of tests/deploy/check_deploy.py, one module per area."""
