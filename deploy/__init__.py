"""The pool owner's stack on Kubernetes: the Helm chart (helm/intellect), its rules (policy.py) and the
offline check CI runs over what it renders (check.py). docs/kubernetes.md."""
