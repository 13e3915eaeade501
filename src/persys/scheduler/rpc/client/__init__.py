"""The servicers clients call (persysctl, the gateway, automation): auth, automation, buckets,
node access, policy, volumes, watch."""
