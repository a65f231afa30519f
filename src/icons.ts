import { LabIcon } from '@jupyterlab/ui-components';

import computeSvgStr from '../style/icons/compute.svg';

/**
 * The icon of the Compute panel in the left sidebar.
 */
export const computeIcon = new LabIcon({
  name: 'jupyter-remote-compute:compute',
  svgstr: computeSvgStr
});
