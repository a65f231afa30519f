"""The machines of a workspace: compute.yaml's entries, their options, and the admin every face changes them through."""
