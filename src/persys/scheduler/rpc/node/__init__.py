"""The servicers nodes call before they hold a certificate or to renew it: the join listener,
Join and Renew."""
