"""The repair controller: pods whose `istio-validation` init container found no capture are labelled or deleted."""
